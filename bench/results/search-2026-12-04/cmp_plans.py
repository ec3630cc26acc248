import sys, yaml, glob, os
rows = []
for f in sorted(glob.glob("new/*.yaml")):
    n = os.path.basename(f)
    a = yaml.safe_load(open("before/" + n)); b = yaml.safe_load(open(f))
    def strip(p):
        p = dict(p); p.pop("predictions", None); s = dict(p["summary"]); s.pop("notes", None); p["summary"] = s; return p
    choice_same = strip(a) == strip(b)
    sa = a["predictions"]["weighted_step_ms"] if "weighted_step_ms" in a["predictions"] else None
    sb = b["predictions"]["weighted_step_ms"] if "weighted_step_ms" in b["predictions"] else None
    wa = a["predictions"]["workloads"][0]; wb = b["predictions"]["workloads"][0]
    print(f"{n:36} choices {'same' if choice_same else 'CHANGED'}  backend {b['summary']['backend']:9} step {wa['step_ms']:.4f} -> {wb['step_ms']:.4f}  compute {wa['compute_ms']:.4f} -> {wb['compute_ms']:.4f}  bound {wa.get('bound')}->{wb.get('bound')}  bytes_identical={open('before/'+n).read()==open(f).read()}")
