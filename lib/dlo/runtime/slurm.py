"""Slurm job scripts for the workbook: fill in the templates of ``slurm/`` for a given cluster.

The templates (``slurm/notebook.sbatch``, ``slurm/torchrun.sbatch``) are directly submittable. ``render``
returns a copy whose ``#SBATCH`` lines carry the account, partition, QoS, constraint, sizes and time you
give, plus the settings of a cluster preset, and whose ``module load`` lines come after the
``# @dlo-modules`` marker::

    from dlo.runtime.slurm import render
    script = render("torchrun", cluster="jean-zay", account="abc@h100", constraint="h100", nodes=2)

From the shell: ``dlo slurm torchrun --cluster jean-zay --account abc@h100 --constraint h100 --nodes 2
-o runs/slurm/train.sbatch`` then ``sbatch runs/slurm/train.sbatch tp_fsdp/fsdp_train.py --model llama-3.2-3b``.
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from dlo.runtime import paths
from dlo.runtime.arguments import ScriptParser

TEMPLATES: tuple[str, ...] = ("notebook", "torchrun")
MODULES_MARKER = "# @dlo-modules"


@dataclass(frozen=True)
class Cluster:
    """What a cluster adds to every job script.

    ``sbatch``: extra ``#SBATCH`` options (``"--hint=nomultithread"``). ``cpus_per_gpu``: CPU cores per GPU,
    keyed by ``--constraint`` (or ``--partition``) value, ``""`` being the default, used for
    ``--cpus-per-task`` when it is not given. ``arch_modules``: a module loaded before the others on that
    constraint (or partition). ``module_purge``: start the module section with ``module purge``.
    ``account_suffix``: accounts of the form ``project@kind`` must name the kind of GPU asked for.
    ``gpus_per_node``: the GPUs a node has, keyed by ``--partition`` then ``--constraint`` value; when given,
    a constraint missing from it does not exist there and is refused, as is a larger ``--gpus-per-node``.
    ``max_hours``: the longest ``--time`` of a QoS, keyed by the end of its name (``"-dev"``, ``"-t3"``), ``""``
    being the QoS a job gets without ``--qos``. Refused here in one line, rather than by sbatch after the edit.
    """

    name: str
    description: str
    sbatch: tuple[str, ...] = ()
    cpus_per_gpu: Mapping[str, int] = field(default_factory=dict)
    arch_modules: Mapping[str, str] = field(default_factory=dict)
    module_purge: bool = False
    account_suffix: Mapping[str, str] = field(default_factory=dict)
    gpus_per_node: Mapping[str, int] = field(default_factory=dict)
    max_hours: Mapping[str, int] = field(default_factory=dict)


CLUSTERS: dict[str, Cluster] = {
    "generic": Cluster(
        name="generic",
        description="any Slurm cluster: only the options you give are changed",
    ),
    "jean-zay": Cluster(
        name="jean-zay",
        description="IDRIS Jean Zay: --hint=nomultithread, cores per GPU from -C (v100 10, a100 8, h100 24), "
        "arch module first (cpuarch/amd on a100, arch/h100 on h100), module purge",
        sbatch=("--hint=nomultithread",),
        cpus_per_gpu={"": 10, "v100": 10, "v100-16g": 10, "v100-32g": 10, "gpu_p2": 3, "gpu_p2s": 3,
                      "gpu_p2l": 3, "a100": 8, "gpu_p5": 8, "h100": 24, "gpu_p6": 24},
        arch_modules={"a100": "cpuarch/amd", "gpu_p5": "cpuarch/amd", "h100": "arch/h100", "gpu_p6": "arch/h100"},
        module_purge=True,
        account_suffix={"v100": "v100", "v100-16g": "v100", "v100-32g": "v100", "a100": "a100", "h100": "h100"},
        # IDRIS's GPU nodes: 4 V100 (8 on gpu_p2), 8 A100 (gpu_p5), 4 H100 (gpu_p6)
        gpus_per_node={"gpu_p2": 8, "gpu_p2s": 8, "gpu_p2l": 8, "gpu_p5": 8, "gpu_p6": 4, "v100": 4,
                       "v100-16g": 4, "v100-32g": 4, "a100": 8, "h100": 4},
        # IDRIS's GPU QoS: -dev 2 h, -t3 20 h (the default), -t4 100 h
        max_hours={"": 20, "-dev": 2, "-t3": 20, "-t4": 100},
    ),
}

# short sbatch options -> long ones, so that "-t 10" and "--time=10" are recognised as the same option
_SHORT = {"-A": "--account", "-p": "--partition", "-q": "--qos", "-C": "--constraint", "-t": "--time",
          "-N": "--nodes", "-n": "--ntasks", "-c": "--cpus-per-task", "-J": "--job-name", "-o": "--output",
          "-e": "--error", "-G": "--gpus", "-w": "--nodelist", "-x": "--exclude", "-d": "--dependency",
          "-a": "--array", "-D": "--chdir", "-Q": "--quiet", "-s": "--oversubscribe"}
_SBATCH_RE = re.compile(r"^#SBATCH\s+(?P<opt>\S+)(?P<rest>.*)$")
_WORD_RE = re.compile(r"^[A-Za-z0-9._@:+%,\-]+$")  # account, partition, qos, job name: no blanks, no quotes
_CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9._@:+,\-&|\[\]*]+$")
_MODULE_RE = re.compile(r"^[A-Za-z0-9._+/@:\-]+$")
_TIME_RE = re.compile(
    r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"  # days-hours[:minutes[:seconds]]
    r"|(?P<h>\d+):(?P<hm>\d+):(?P<hs>\d+)"                          # hours:minutes:seconds
    r"|(?P<m>\d+)(?::(?P<ms>\d+))?)$"                                # minutes[:seconds]
)


def template_path(name: str) -> Path:
    """``slurm/<name>.sbatch`` in the checkout. ValueError for an unknown template."""
    if name not in TEMPLATES:
        raise ValueError(f"unknown Slurm template {name!r}: choose one of {', '.join(TEMPLATES)}")
    path = paths.ROOT / "slurm" / f"{name}.sbatch"
    if not path.is_file():
        raise ValueError(f"{path} is missing: run from a checkout of the workbook (or set DLO_ROOT to one)")
    return path


def _check_time(value: str | int) -> str:
    text = str(value).strip()
    if text.lower() in ("infinite", "unlimited"):
        return text
    m = _TIME_RE.match(text)
    if not m:
        raise ValueError(f"malformed time {value!r}: use Slurm's MINUTES, HH:MM:SS or D-HH:MM:SS, e.g. 02:00:00")
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    for key in ("dm", "ds", "hm", "hs", "ms"):
        if g.get(key, 0) >= 60:
            raise ValueError(f"malformed time {value!r}: minutes and seconds must be below 60, e.g. 01:30:00")
    if g.get("dh", 0) >= 24:
        raise ValueError(f"malformed time {value!r}: hours after 'D-' must be below 24, e.g. 1-12:00:00")
    total = (g.get("d", 0) * 1440 + g.get("dh", 0) * 60 + g.get("h", 0) * 60
             + g.get("dm", 0) + g.get("hm", 0) + g.get("m", 0))
    if total == 0 and not any(g.get(k, 0) for k in ("ds", "hs", "ms")):
        raise ValueError(f"time {value!r} is zero: give the job some time, e.g. 02:00:00")
    return text


def _minutes(text: str) -> float:
    """A time already checked by :func:`_check_time`, in minutes (infinite for "unlimited")."""
    m = _TIME_RE.match(text)
    if m is None:
        return float("inf")
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    return (g.get("d", 0) * 1440 + (g.get("dh", 0) + g.get("h", 0)) * 60 + g.get("dm", 0) + g.get("hm", 0)
            + g.get("m", 0) + (g.get("ds", 0) + g.get("hs", 0) + g.get("ms", 0)) / 60)


def _check_count(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value), 10)
        except ValueError:
            raise ValueError(f"{name} must be a whole number >= 1, not {value!r}") from None
    if value < 1:
        raise ValueError(f"{name} must be >= 1, not {value}")
    return value


_EXAMPLES = {"account": "abc@h100", "partition": "gpu_p6", "qos": "qos_gpu_h100-dev", "constraint": "h100",
             "job name": "jour1"}


def _check_word(name: str, value: str | None, pattern: re.Pattern = _WORD_RE) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    if not text or not pattern.match(text):
        raise ValueError(f"invalid {name} {value!r}: one word without blanks or quotes, e.g. {_EXAMPLES[name]}")
    return text


def _option_key(token: str) -> str:
    """``--time=10`` -> ``--time``; ``-t`` -> ``--time``; ``-t10`` -> ``--time``."""
    if token.startswith("--"):
        return token.split("=", 1)[0]
    if token[:2] in _SHORT:
        return _SHORT[token[:2]]
    return token[:2]


def _parse_extra(item: str) -> tuple[str, str]:
    """One extra option, ``--mail-type=END`` or ``mail-type=END`` or ``-x node1`` -> (key, text)."""
    text = str(item).strip()
    if not text or "\n" in text or "\r" in text or "#" in text:
        raise ValueError(f"invalid extra #SBATCH option {item!r}: give one option such as --mail-type=END")
    if not text.startswith("-"):
        text = "--" + text
    if text.startswith("--") and re.search(r"\s", text):
        raise ValueError(f"invalid extra #SBATCH option {item!r}: write it as --name=value, without blanks")
    if len(text) < 3 or text in ("--", "---"):
        raise ValueError(f"invalid extra #SBATCH option {item!r}: give one option such as --mail-type=END")
    return _option_key(text), text


def _header_end(lines: list[str]) -> int:
    """Index of the first line after the leading comment block (sbatch reads #SBATCH lines only there)."""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return i
    return len(lines)


def _header_value(lines: list[str], key: str) -> str | None:
    for line in lines[:_header_end(lines)]:
        m = _SBATCH_RE.match(line)
        if m and _option_key(m["opt"]) == key:
            opt = m["opt"]
            if "=" in opt:
                return opt.split("=", 1)[1]
            rest = m["rest"].split("#", 1)[0].split()
            return rest[0] if rest else None
    return None


def _set_options(lines: list[str], options: list[tuple[str, str]]) -> list[str]:
    """Replace (first occurrence, keeping its comment) or append after the last #SBATCH line."""
    end = _header_end(lines)
    out = list(lines)
    new: list[str] = []
    for key, text in options:
        found = [i for i in range(end) if (m := _SBATCH_RE.match(out[i])) and _option_key(m["opt"]) == key]
        if not found:
            new.append(f"#SBATCH {text}")
            continue
        first = found[0]
        m = _SBATCH_RE.match(out[first])
        comment = re.search(r"\s+#.*$", m["rest"])
        line = f"#SBATCH {text}"
        if comment:  # keep the comment, in its column when there is room
            note = comment.group(0).lstrip()
            column = len(out[first]) - len(note)
            line = line.ljust(column) + note if len(line) < column else f"{line}  {note}"
        out[first] = line
        for i in found[1:]:
            out[i] = None  # type: ignore[call-overload]
    out = [line for line in out if line is not None]
    if new:
        end = _header_end(out)
        last = max((i for i in range(end) if _SBATCH_RE.match(out[i])), default=end - 1)
        out[last + 1:last + 1] = new
    return out


def render(
    template: str,
    *,
    cluster: str = "generic",
    account: str | None = None,
    partition: str | None = None,
    qos: str | None = None,
    constraint: str | None = None,
    time: str | int | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    cpus_per_task: int | None = None,
    job_name: str | None = None,
    extra_sbatch: Sequence[str] = (),
    modules: Sequence[str] = (),
) -> str:
    """The job script ``slurm/<template>.sbatch`` with its ``#SBATCH`` lines set for these options.

    ``template``: ``"notebook"`` (one notebook, one task) or ``"torchrun"`` (one task per GPU, so
    ``gpus_per_node`` also sets ``--ntasks-per-node``). ``cluster``: a key of ``CLUSTERS``. ``time``:
    Slurm's format (``"02:00:00"``, ``"1-00:00:00"``, ``90`` minutes). ``extra_sbatch``: more options as
    written after ``#SBATCH`` (``"--mail-type=END"``); they replace a template line of the same option.
    ``modules``: ``module load`` lines written after the ``# @dlo-modules`` marker (preceded by the
    preset's ``module purge`` and arch module). Options left at None keep the template's value.
    Raises ValueError (one line) for an unknown template or cluster, an invalid value, or one the cluster
    would refuse (a time above the QoS's limit, a constraint or GPU count its nodes do not have).
    """
    path = template_path(template)
    if cluster not in CLUSTERS:
        raise ValueError(f"unknown cluster preset {cluster!r}: choose one of {', '.join(CLUSTERS)}")
    preset = CLUSTERS[cluster]
    req = _Request(template, _check_word("account", account), _check_word("partition", partition),
                   _check_word("qos", qos), _check_word("constraint", constraint, _CONSTRAINT_RE),
                   _check_time(time) if time is not None else None, _check_count("nodes", nodes),
                   _check_count("gpus_per_node", gpus_per_node), _check_count("cpus_per_task", cpus_per_task),
                   _check_word("job name", job_name), *_check_lists(extra_sbatch, modules))
    _check_against(preset, req)
    lines = path.read_text().splitlines()
    if req.cpus_per_task is None:
        req.cpus_per_task = _preset_cpus(preset, req, lines)
    lines = _set_options(lines, _sbatch_options(preset, req))
    if req.modules:
        lines = _insert_modules(lines, preset, req, path)
    summary = [f"--{k.replace('_', '-')} {shlex.quote(str(v))}" for k, v in (
        ("cluster", cluster), ("account", req.account), ("partition", req.partition), ("qos", req.qos),
        ("constraint", req.constraint), ("time", req.time), ("nodes", req.nodes),
        ("gpus_per_node", req.gpus_per_node), ("cpus_per_task", req.cpus_per_task), ("job_name", req.job_name))
        if v is not None]
    summary += [f"--sbatch={shlex.quote(t)}" for _, t in req.extras] + [f"--module {shlex.quote(m)}" for m in modules]
    start = 1 if lines and lines[0].startswith("#!") else 0
    lines[start:start] = [f"# Rendered from slurm/{template}.sbatch (edit that, not this) by:",
                          f"#   dlo slurm {template} {' '.join(summary)}".rstrip()]
    return "\n".join(lines) + "\n"


@dataclass
class _Request:
    """The values of one :func:`render`, each checked (None: keep the template's)."""

    template: str
    account: str | None
    partition: str | None
    qos: str | None
    constraint: str | None
    time: str | None
    nodes: int | None
    gpus_per_node: int | None
    cpus_per_task: int | None
    job_name: str | None
    extras: list[tuple[str, str]]
    modules: list[str]


def _check_lists(extra_sbatch: Sequence[str], modules: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    if isinstance(extra_sbatch, str) or isinstance(modules, str):
        raise ValueError("extra_sbatch and modules are lists of strings, e.g. modules=['pytorch-gpu/py3/2.7.0']")
    extras = [_parse_extra(item) for item in extra_sbatch]
    names = []
    for name in modules:
        text = str(name).strip()
        if not _MODULE_RE.match(text):
            raise ValueError(f"invalid module name {name!r}: one name such as pytorch-gpu/py3/2.7.0")
        names.append(text)
    return extras, names


def _check_against(preset: Cluster, req: _Request) -> None:
    """What the template and the cluster would refuse, in one line before anything is written."""
    if req.template == "notebook" and req.nodes is not None and req.nodes > 1:
        raise ValueError(f"the notebook template runs on one node, not {req.nodes}: "
                         "use the torchrun template for several nodes")
    account, constraint = req.account, req.constraint
    if account and "@" in account and preset.account_suffix and constraint:
        wanted = preset.account_suffix.get(constraint)
        if wanted and account.rsplit("@", 1)[1] != wanted:
            raise ValueError(f"account {account!r} does not match --constraint {constraint}: "
                             f"use the project's {wanted} hours, e.g. {account.rsplit('@', 1)[0]}@{wanted}")
    known = preset.gpus_per_node
    simple = constraint is not None and _WORD_RE.match(constraint) is not None  # not an expression (a|b, a&b)
    if known and simple and constraint not in known:
        kinds = ", ".join(k for k in known if not k.startswith("gpu_"))
        raise ValueError(f"no {preset.name} node has the feature --constraint {constraint}: use one of {kinds}")
    node = next((known[k] for k in (req.partition, constraint) if k in known), None)
    if node is not None and req.gpus_per_node is not None and req.gpus_per_node > node:
        where = req.partition if req.partition in known else constraint
        raise ValueError(f"{where} nodes of {preset.name} have {node} GPUs, not {req.gpus_per_node}: "
                         f"use --gpus-per-node {node} or fewer, and more --nodes")
    if preset.max_hours and req.time is not None:
        qos = req.qos or ""
        suffix = next((s for s in preset.max_hours if s and qos.endswith(s)), "" if not qos else None)
        limit = preset.max_hours.get(suffix) if suffix is not None else None
        if limit is not None and _minutes(req.time) > limit * 60:
            which = f"the QoS {qos}" if qos else "the default QoS"
            raise ValueError(f"--time {req.time} is above the {limit} h of {which} on {preset.name}: "
                             "ask for less, or split the run and resume it from its checkpoint (slurm/README.md)")


def _preset_cpus(preset: Cluster, req: _Request, lines: list[str]) -> int | None:
    """The CPU cores the preset gives per GPU (times the GPUs of a notebook's one task), when not given."""
    per = preset.cpus_per_gpu
    key = req.constraint if req.constraint in per else req.partition if req.partition in per else ""
    if key not in per:
        return None
    if req.template == "notebook":
        gpus = req.gpus_per_node or _check_count("gpus-per-node", _header_value(lines, "--gpus-per-node") or 1)
        return per[key] * gpus
    return per[key]


def _sbatch_options(preset: Cluster, req: _Request) -> list[tuple[str, str]]:
    """The ``(option, "#SBATCH text")`` pairs to set: the values given, the preset's, the extras."""
    options: list[tuple[str, str]] = []
    for key, value in (("--job-name", req.job_name), ("--account", req.account), ("--partition", req.partition),
                       ("--qos", req.qos), ("--constraint", req.constraint), ("--nodes", req.nodes),
                       ("--ntasks-per-node", req.gpus_per_node if req.template == "torchrun" else None),  # 1 per GPU
                       ("--gpus-per-node", req.gpus_per_node), ("--cpus-per-task", req.cpus_per_task),
                       ("--time", req.time)):
        if value is not None:
            options.append((key, f"{key}={value}"))
    given = {k for k, _ in options}
    for item in preset.sbatch:
        k, t = _parse_extra(item)
        if k not in given:
            options.append((k, t))
    for k, t in req.extras:
        if k in given:
            raise ValueError(f"{k} is given twice (as an option and in extra_sbatch): give it once")
        options = [(ok, ot) for ok, ot in options if ok != k] + [(k, t)]
    return options


def _insert_modules(lines: list[str], preset: Cluster, req: _Request, path: Path) -> list[str]:
    """``module load`` lines after the marker (the preset's ``module purge`` and arch module first)."""
    try:
        at = [line.strip() for line in lines].index(MODULES_MARKER)
    except ValueError:
        raise ValueError(f"{path} has no '{MODULES_MARKER}' line: modules cannot be placed") from None
    names = list(req.modules)
    loads = ["module purge"] if preset.module_purge else []
    arch = preset.arch_modules.get(req.constraint or "") or preset.arch_modules.get(req.partition or "")
    if arch and arch not in names:
        names.insert(0, arch)
    loads += [f"module load {name}" for name in names]
    return lines[:at + 1] + loads + lines[at + 1:]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``dlo slurm``."""
    clusters = "; ".join(f"{c.name}: {c.description}" for c in CLUSTERS.values())
    p = ScriptParser(
        prog="dlo slurm",
        description="Print a Slurm job script from slurm/<TEMPLATE>.sbatch with these #SBATCH settings. "
        "Submit it from the repository root: sbatch FILE NOTEBOOK.ipynb | SCRIPT.py [args].",
    )
    p.add_argument("template", metavar="TEMPLATE", help=f"one of: {', '.join(TEMPLATES)}")
    p.add_argument("--cluster", default="generic", help=f"preset (default generic). {clusters}")
    p.add_argument("-A", "--account", help="account to charge (Jean Zay: abc@v100, abc@a100, abc@h100)")
    p.add_argument("-p", "--partition", help="partition (as sbatch -p; not a notebook parameter: those are given to the job, `dlo run NB -p NAME VALUE`)")
    p.add_argument("-q", "--qos", help="quality of service (Jean Zay: qos_gpu-dev, qos_gpu_h100-t3, ...)")
    p.add_argument("-C", "--constraint", help="node feature (Jean Zay: v100-32g, a100, h100)")
    p.add_argument("-t", "--time", help="time limit: MINUTES, HH:MM:SS or D-HH:MM:SS")
    p.add_argument("-N", "--nodes", help="number of nodes (torchrun template only)")
    p.add_argument("--gpus-per-node", help="GPUs per node (torchrun: also one task per GPU)")
    p.add_argument("-c", "--cpus-per-task", help="CPU cores per task (default: the preset's per GPU)")
    p.add_argument("-J", "--job-name", help="job name (log file runs/slurm/<job-name>-<job-id>.out)")
    p.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                   help="extra #SBATCH option, repeatable: --sbatch=--mail-type=END")
    p.add_argument("--module", action="append", default=[], metavar="NAME",
                   help="module to load, repeatable: --module pytorch-gpu/py3/2.7.0")
    p.add_argument("-o", "--out", metavar="FILE", help="write the script to FILE instead of printing it")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``dlo slurm TEMPLATE [options] [-o FILE]``. Returns the exit status (2 on bad input)."""
    args = build_parser().parse_args(argv)
    try:
        script = render(
            args.template, cluster=args.cluster, account=args.account, partition=args.partition,
            qos=args.qos, constraint=args.constraint, time=args.time, nodes=args.nodes,
            gpus_per_node=args.gpus_per_node, cpus_per_task=args.cpus_per_task, job_name=args.job_name,
            extra_sbatch=args.sbatch, modules=args.module,
        )
    except ValueError as exc:
        print(f"dlo slurm: error: {exc}", file=sys.stderr)
        return 2
    # Slurm does not create the folder of --output; without it the job fails with no log at all.
    (paths.ROOT / "runs" / "slurm").mkdir(parents=True, exist_ok=True)
    if args.out:
        out = Path(args.out)
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(script)
        except OSError as exc:
            print(f"dlo slurm: error: cannot write {out}: {exc.strerror}; choose another -o FILE", file=sys.stderr)
            return 2
        print(f"wrote {out}; submit from {paths.ROOT}: sbatch {out} "
              f"{'NOTEBOOK.ipynb' if args.template == 'notebook' else 'SCRIPT.py'} [args]", file=sys.stderr)
    else:
        sys.stdout.write(script)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
