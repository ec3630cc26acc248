"""Bad command lines and output paths: where `-o` cannot write, option values the command
does not take, missing or extra arguments, options that contradict each other, budgets
missing their unit. Each ends with its exit code and a message naming the problem."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from cli_samples import TINY_SPEC

from corpus.case import CliCase

SPEC = {"spec.yaml": TINY_SPEC.replace("gpu_budget: 2KB", "gpu_budget: 8KB")}
PLAN = ("plan", "{d}/spec.yaml")


def _mkdir(name: str):
    return lambda d: (d / name).mkdir()


def _link(name: str, target: str):
    return lambda d: (d / name).symlink_to(target)


def _loop(d: Path) -> None:
    (d / "a.yaml").symlink_to("b.yaml")
    (d / "b.yaml").symlink_to("a.yaml")


def _chain_into_missing_folder(d: Path) -> None:
    (d / "latest.yaml").symlink_to("current.yaml")
    (d / "current.yaml").symlink_to("releases/v2/plan.yaml")


def _socket(d: Path) -> None:
    here = os.getcwd()
    os.chdir(d)  # a relative name: a socket path has a short length limit
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind("planner.sock")  # the file stays after the socket is closed
    finally:
        os.chdir(here)


def _read_only_folder(d: Path) -> None:
    (d / "locked").mkdir()
    (d / "locked" / "p.yaml").write_text("old\n")
    (d / "locked").chmod(0o555)


def _read_only_file(d: Path) -> None:
    (d / "p.yaml").write_text("old\n")
    (d / "p.yaml").chmod(0o444)


CASES = [
    # -- where -o cannot write: exit 2, the path as given, and why
    CliCase("out-is-a-folder", (*PLAN, "-o", "{d}/plans"), SPEC, setup=_mkdir("plans"),
            expect=("plans: cannot write: Is a directory",)),
    CliCase("out-missing-parent-folder", (*PLAN, "-o", "{d}/no/such/p.yaml"), SPEC,
            expect=("no/such/p.yaml: cannot write: No such file or directory", "the folder", "does not exist")),
    CliCase("out-parent-is-a-file", (*PLAN, "-o", "{d}/spec.yaml/p.yaml"), SPEC,
            expect=("spec.yaml/p.yaml: cannot write", "spec.yaml is not a folder")),
    CliCase("out-trailing-slash-names-a-folder", (*PLAN, "-o", "{d}/newdir/"), SPEC,
            expect=("newdir/: cannot write", "names a folder")),
    CliCase("out-empty-path", (*PLAN, "-o", ""), SPEC, expect=("--output' / '-o': an empty value",)),
    CliCase("out-symlink-loop", (*PLAN, "-o", "{d}/a.yaml"), SPEC, setup=_loop,
            expect=("a.yaml: cannot write: Too many levels of symbolic links",)),
    CliCase("out-dangling-symlink-into-missing-folder", (*PLAN, "-o", "{d}/latest.yaml"), SPEC,
            setup=_link("latest.yaml", "gone/plan.yaml"),
            expect=("latest.yaml: cannot write", "links to", "gone/plan.yaml", "does not exist")),
    CliCase("out-symlink-chain-ends-in-missing-folder", (*PLAN, "-o", "{d}/latest.yaml"), SPEC,
            setup=_chain_into_missing_folder, expect=("latest.yaml: cannot write", "releases/v2", "does not exist")),
    CliCase("out-symlink-to-a-folder", ("schema", "spec", "-o", "{d}/link"), setup=lambda d: (
        (d / "real").mkdir(), (d / "link").symlink_to("real")), expect=("link: cannot write: Is a directory",)),
    CliCase("out-folder-behind-a-dangling-folder-link", (*PLAN, "-o", "{d}/out/p.yaml"), SPEC,
            setup=_link("out", "missing-dir"), expect=("out/p.yaml: cannot write", "does not exist")),
    CliCase("out-is-a-socket", ("schema", "plan", "-o", "{d}/planner.sock"), setup=_socket,
            expect=("planner.sock: cannot write", "not a regular file, a FIFO or a character device")),
    CliCase("schema-out-is-a-folder", ("schema", "plan", "-o", "{d}"), expect=("cannot write: Is a directory",)),
    # -- option values, arguments and options click rejects: exit 2 with its usage line
    CliCase("plan-format-xml", (*PLAN, "--format", "xml"), SPEC,
            expect=("Invalid value for '--format'", "'xml' is not one of 'yaml', 'json'")),
    CliCase("show-format-yaml", ("show", "{d}/p.yaml", "--format", "yaml"),
            expect=("Invalid value for '--format'", "'yaml' is not one of 'text', 'json'")),
    CliCase("diff-format-html", ("diff", "{d}/a.yaml", "{d}/b.yaml", "-f", "html"),
            expect=("Invalid value for '--format'", "'html' is not one of 'text', 'markdown', 'json'")),
    CliCase("plan-backend-gpu", (*PLAN, "--backend", "gpu"), SPEC,
            expect=("Invalid value for '--backend'", "'gpu' is not one of")),
    CliCase("schema-kind-model", ("schema", "model"), expect=("'model' is not one of 'spec', 'plan'",)),
    CliCase("plan-group-size-zero", (*PLAN, "--group-size", "0"), SPEC,
            expect=("Invalid value for '--group-size'",)),
    CliCase("plan-unknown-option", (*PLAN, "--gpu", "12GB"), SPEC, expect=("No such option: --gpu",)),
    CliCase("unknown-command", ("plna", "{d}/spec.yaml"), SPEC, expect=("No such command 'plna'", "'plan'")),
    CliCase("plan-missing-spec", ("plan",), expect=("Missing argument 'SPEC'",)),
    CliCase("diff-missing-new", ("diff", "{d}/a.yaml"), expect=("Missing argument 'NEW'",)),
    CliCase("show-extra-argument", ("show", "{d}/a.yaml", "{d}/b.yaml"),
            expect=("unexpected extra argument",)),
    CliCase("output-without-a-value", (*PLAN, "-o"), SPEC, expect=("Option '-o' requires an argument",)),
    CliCase("debug-after-the-command", (*PLAN, "--debug"), SPEC, expect=("No such option: --debug",)),
    CliCase("spec-both-sources", ("spec", "--from-safetensors", "{d}/m.safetensors", "--from-hf-config",
                                  "{d}/config.json"), expect=("give exactly one of --from-safetensors",)),
    CliCase("spec-no-source", ("spec", "-o", "{d}/s.yaml"), expect=("give exactly one of",)),
    CliCase("plan-gpu-budget-words", (*PLAN, "--gpu-budget", "twelve"), SPEC,
            expect=("--gpu-budget: expected a size", "(got 'twelve')")),
    # -- a budget that misses its unit: still exit 1 (infeasible), with a hint. Strategy budget: auto
    # meets a budget of a few bytes by reading every param through UVA, and the hint is for infeasible plans
    CliCase("plan-gpu-budget-bare-20", (*PLAN, "--gpu-budget", "20", "--strategy", "budget"), SPEC, exit=1,
            expect=("hint: --gpu-budget 20: did you mean 20GB? a bare number is a number of bytes",)),
    CliCase("plan-file-gpu-budget-bare", ("plan", "{f}"), {"bad.yaml": TINY_SPEC.replace("2KB", "12").replace("backend: uva", "backend: uva\n  strategy: budget")}, exit=1,
            expect=("hint: memory.gpu_budget 12: did you mean 12GB?",)),
    CliCase("plan-cpu-budget-bare", ("plan", "{f}", "-g", "4KB", "--cpu-budget", "64"), {"bad.yaml": TINY_SPEC},
            exit=1,
            expect=("cpu_budget", "hint: --cpu-budget 64: did you mean 64GB?")),
]

if os.geteuid() != 0:  # root may write anywhere, so these cannot fail for root
    CASES += [
        CliCase("out-file-in-read-only-folder", (*PLAN, "-o", "{d}/locked/p.yaml"), SPEC, setup=_read_only_folder,
                expect=("locked/p.yaml: cannot write: Permission denied", "is not writable")),
        CliCase("out-read-only-file", (*PLAN, "-o", "{d}/p.yaml"), SPEC, setup=_read_only_file,
                expect=("p.yaml: cannot write: Permission denied", "the file is read-only")),
    ]
