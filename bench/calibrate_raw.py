"""``planner calibrate``'s profile with its raw timings kept, for bench/replay_predict.py to predict measured rows
again with (issue 19).

    PYTHONPATH=. python bench/calibrate_raw.py        # the H200: $OUT/profile.yaml, $OUT/calibrate-raw.json

Prints the figures the cost model's decode rows lean on: ``gpu_mem_gbps``, ``block_gpu_us``, ``matmul_gbps_rows``
and the replayed block's times they come from, the UVA matmuls' times (a narrow 1,024 x 4,096 weight at 1 and
2,048 rows among them), and calibrate's steadiness check."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.calibrate import calibrate  # noqa: E402
from schemas.io import dump_model  # noqa: E402


def main() -> int:
    out = Path(os.environ.get("OUT", "."))
    hw, raw = calibrate("cuda", "h200-calibrated")
    (out / "profile.yaml").write_text(dump_model(hw))
    (out / "calibrate-raw.json").write_text(json.dumps(raw, default=str, indent=1))
    print(json.dumps({"gpu_mem_gbps": hw.gpu_mem_gbps, "block_gpu_us": hw.block_gpu_us,
                      "matmul_gbps_rows": [[p.tokens, p.gbps] for p in hw.matmul_gbps_rows or []],
                      "raw_block_ms": raw.get("raw_block_ms"), "raw_uva_ms": raw.get("raw_uva_ms"),
                      "steady": raw["steady"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
