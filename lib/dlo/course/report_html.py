"""The HTML of ``dlo report`` (:mod:`dlo.course.report` reads the files): one static page, no script.

Every value that comes from a file goes through :func:`esc` (``html.escape`` with quotes) before it reaches the
page, markdown included (escaped first, then the few marks REFERENCES.md uses turned into tags); images are
embedded only when their bytes start as a PNG's, as ``data:image/png`` URLs.
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence


# The records below (runs, gpu-check rows, references, figures) are those of dlo.course.report, which imports this
# module: they are read by attribute here.
Run = CheckRow = Figure = NotebookReport = Reference = Any

#: The verdict of a recorded sentence, from the words the decision rule's sentences use (dlo.measure.sentences);
#: the first pattern that matches wins.
VERDICTS: tuple[tuple[str, str, str], ...] = (
    (r"^No ratio reported|^No break-even reported for [^:]*: (?!whether)", "not steady", "unsteady"),
    (r"undecided", "undecided", "undecided"),
    (r"no measurable difference|not faster than .* beyond the noise|not faster beyond the noise", "no measurable "
     "difference", "same"),
    (r" is slower than | was slower ", "slower", "slower"),
    (r" is [0-9.]+x faster than |[0-9.]+x faster", "faster", "faster"),
)

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1500px;padding:1em 2em;
color:#1d2330;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:2px solid #ccd;margin-top:2em}h3{margin:.2em 0}
.meta,.where,.none{color:#555;font-size:.9em}
nav ul{columns:3;font-size:.9em}
section.notebook{margin:1.5em 0;padding:.8em 1em;border:1px solid #dde;border-radius:6px;background:#fbfbfe}
.runs{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}
article.run{flex:1 1 440px;max-width:100%;border:1px solid #cfd3e0;border-radius:6px;padding:.6em .8em;
background:#fff;overflow-x:auto}
article.recorded{border-color:#7a9cd6;background:#f5f8ff}
article.reference{border-color:#b9a35a;background:#fffbea}
.device{font-size:1.05em;font-weight:600}
.badge{display:inline-block;padding:0 .45em;border-radius:3px;font-size:.8em;font-weight:600;color:#fff;
background:#667}
.badge.faster,.badge.met,.badge.ok{background:#2e7d32}.badge.slower,.badge.MISSED,.badge.failed{background:#c62828}
.badge.same{background:#607d8b}.badge.undecided{background:#b26a00}.badge.unsteady{background:#8d6e63}
.badge.reference{background:#8a6d00}.badge.recorded{background:#2f5fb3}
table{border-collapse:collapse;font-size:.88em;margin:.4em 0}
td,th{border:1px solid #dde;padding:.15em .45em;vertical-align:top;text-align:left}
td.num{text-align:right;white-space:nowrap}
.problem{color:#b00020;font-family:ui-monospace,monospace;font-size:.88em}
figure{display:inline-block;margin:.3em;vertical-align:top}figure img{max-width:420px;height:auto;
border:1px solid #eee}figcaption{font-size:.8em;color:#555}
code{background:#eef;padding:0 .2em;border-radius:2px}
"""


def one_line(text: Any) -> str:
    return " ".join(str(text).split())


def esc(value: Any) -> str:
    """Text for the page: every ``<``, ``>``, ``&`` and quote escaped."""
    return html.escape(str(value), quote=True)


def number(x: Any) -> str:
    """A number as the page shows it: thousands separated, 3 significant digits below 1,000."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if not math.isfinite(x):
        return str(x)
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def verdict(sentence: str) -> tuple[str, str]:
    """``(words, css class)`` of a recorded sentence; ``("stated", "")`` when no pattern matches."""
    for pattern, words, css in VERDICTS:
        if re.search(pattern, sentence):
            return words, css
    return "stated", ""


def _badge(words: str, css: str) -> str:
    return f'<span class="badge {esc(css)}">{esc(words)}</span>'


def measurement(rec: Any) -> str:
    """``name: 1,234 img/s [1,100-1,300], spread 12 %`` from a measurement's record (median throughput, the noise
    band between the quartiles, and the interquartile range over the median)."""
    if not isinstance(rec, Mapping):
        return "(no numbers recorded)"
    unit = rec.get("unit") if isinstance(rec.get("unit"), str) else ""
    thr, low, high = (_num(rec.get(k)) for k in ("throughput", "throughput_low", "throughput_high"))
    if thr is None and _num(rec.get("median_s")) and _num(rec.get("items_per_call")):
        thr = rec["items_per_call"] / rec["median_s"]
    text = f"{esc(rec.get('name', '?'))}: " + (f"{number(thr)} {esc(unit)}" if thr is not None else "no median")
    if low is not None and high is not None:
        text += f" [{number(low)}&ndash;{number(high)}]"
    spread = _num(rec.get("spread"))
    if spread is not None:
        text += f", spread {spread:.0%}"
    if isinstance(rec.get("repeats"), int):
        text += f" ({rec['repeats']} repeats)"
    return text


# --------------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------------

def environment(results: Mapping[str, Any]) -> dict[str, Any]:
    env = results.get("env", results.get("environment"))
    return env if isinstance(env, dict) else {}


def device_label(env: Mapping[str, Any]) -> str:
    """The GPU's name, or ``CPU (x86_64, 2 cores)``, or ``device not recorded``."""
    if env.get("gpu"):
        return str(env["gpu"])
    if env.get("device") or env.get("cpu"):
        cores = f", {env['cpu_cores']} cores" if env.get("cpu_cores") else ""
        return f"CPU ({env.get('cpu') or env.get('device')}{cores})"
    return "device not recorded"


def _env_line(env: Mapping[str, Any], profile: Any) -> str:
    parts = [f"profile {profile}"] if isinstance(profile, str) and len(profile) < 40 else []
    for key, label in (("date", ""), ("torch", "torch "), ("cuda", "CUDA "), ("python", "Python "),
                       ("torch_threads", "threads "), ("cpu_capability", "")):
        if env.get(key) not in (None, ""):
            parts.append(f"{label}{env[key]}")
    return esc(" · ".join(map(str, parts)))


def _conclusions(results: Mapping[str, Any]) -> str:
    rows = []
    for c in results.get("conclusions") or []:
        if not isinstance(c, Mapping):
            continue
        sentence = str(c.get("sentence", ""))
        if c.get("kind") == "retry":  # the outcome at the last batch tried is the verdict
            words, css = verdict(re.split(r"\), (?:but|and still|and) ", sentence)[-1])
        else:
            words, css = verdict(sentence)
        rows.append(f"<tr><td>{_badge(words, css)}</td><td>{inline(sentence)}</td>"
                    f"<td>{measurement(c.get('a'))}<br>{measurement(c.get('b'))}</td></tr>")
    if not rows:
        return ""
    return ("<h4>Headline numbers</h4><table class=\"headline\"><tr><th>verdict</th><th>what the run states</th>"
            "<th>medians [noise band], spread</th></tr>" + "".join(rows) + "</table>")


def _ladder(results: Mapping[str, Any]) -> str:
    ladder = [r for r in results.get("ladder") or [] if isinstance(r, Mapping)]
    if not ladder:
        return ""
    head = ""
    if results.get("final_sentence"):
        words, css = verdict(str(results["final_sentence"]))
        speedup = _num(results.get("final_speedup"))
        head = (f"<p>{_badge(words, css)} {inline(str(results['final_sentence']))}"
                + (f" <strong>Speed-up: {number(speedup)}x</strong>" if speedup is not None else "") + "</p>")
    rows = []
    for r in ladder:
        ratio = r.get("vs_best_text") or (number(r["vs_best"]) + "x" if _num(r.get("vs_best")) else "")
        numbers = measurement({**r, "name": r.get("step")}) if r.get("applicable") else esc(r.get("reason") or "")
        rows.append(f"<tr><td>{esc(r.get('step', '?'))}</td><td>{esc(r.get('batch_size', ''))}</td>"
                    f"<td>{numbers}</td><td>{esc(r.get('decision', ''))}</td><td class=\"num\">{esc(ratio)}</td></tr>")
    return ("<h4>The ladder</h4>" + head + "<table><tr><th>step</th><th>batch</th><th>median [noise band], spread"
            "</th><th>decision</th><th>vs best</th></tr>" + "".join(rows) + "</table>")


def _stated(results: Mapping[str, Any]) -> str:
    """Other sentences (``*_sentence`` keys), skipped parts, and the top-level scalar values."""
    said = [(k, v) for k, v in results.items() if k.endswith("sentence") and k != "final_sentence"
            and isinstance(v, str)]
    said += [(k, s) for k, v in results.items() if k.endswith("sentences") and isinstance(v, list)
             for s in v if isinstance(s, str)]
    said += [(k, "skipped: " + str(v["skipped"])) for k, v in results.items()
             if isinstance(v, Mapping) and isinstance(v.get("skipped"), str)]
    out = ""
    if said:
        out += "<h4>Also stated</h4><ul>" + "".join(f"<li><code>{esc(k)}</code>: {inline(v)}</li>" for k, v in said) \
            + "</ul>"
    values = [(k, v) for k, v in results.items() if k not in ("profile", "final_speedup") and (
        _num(v) is not None or isinstance(v, bool) or (isinstance(v, str) and len(v) <= 120
                                                      and not k.endswith("sentence")))][:16]
    if values:
        out += "<h4>Recorded values</h4><table>" + "".join(
            f"<tr><td><code>{esc(k)}</code></td><td class=\"num\">{esc(number(v))}</td></tr>" for k, v in values) \
            + "</table>"
    return out


def figure_html(fig: Figure, page: Path) -> str:
    if fig.problem:
        return f'<p class="problem">{esc(fig.problem)}</p>'
    if fig.data is not None:
        src = "data:image/png;base64," + base64.b64encode(fig.data).decode("ascii")
    else:
        src = Path(os.path.relpath(fig.path, page.parent)).as_posix()
    return (f'<figure><img src="{esc(src)}" alt="{esc(fig.path.name)}" loading="lazy">'
            f"<figcaption>{esc(fig.path.name)}</figcaption></figure>")


def run_html(run: Run, page: Path) -> str:
    origin = "recorded GPU run (results/)" if run.origin == "recorded" else "run"
    if run.results is None:
        return (f'<article class="run {esc(run.origin)}"><p class="device">{esc(origin)}: cannot be shown</p>'
                f'<p class="problem">{esc(run.problem or run.path)}</p></article>')
    env = environment(run.results)
    try:
        body = _conclusions(run.results) + _ladder(run.results) + _stated(run.results)
    except Exception as exc:  # a record of an unexpected shape: one line, the rest of the page goes on
        body = f'<p class="problem">{esc(run.path)}: part of it could not be shown ({esc(one_line(exc))})</p>'
    figures = "".join(figure_html(f, page) for f in run.figures)
    badge = _badge("recorded", "recorded") + " " if run.origin == "recorded" else ""
    return (f'<article class="run {esc(run.origin)}"><p class="device">{badge}{esc(device_label(env))}</p>'
            f'<p class="where">{esc(origin)}: <code>{esc(run.path)}</code><br>'
            f"{_env_line(env, run.results.get('profile'))}</p>{body or '<p class=none>No headline recorded.</p>'}"
            + (f"<h4>Figures</h4>{figures}" if figures else "") + "</article>")


def checks_html(checks: Sequence[CheckRow]) -> str:
    if not checks:
        return ""
    out = []
    for c in checks:
        r = c.row
        v = str(r.get("verdict", ""))
        what = r.get("what") or ("dry profile, plain engine" if c.quick else r.get("benchmark", ""))
        value = f"{number(r['value'])}" if _num(r.get("value")) is not None else "&ndash;"
        out.append(f"<tr><td>{esc(r.get('benchmark') or r.get('notebook') or '?')}</td><td>{esc(what)}</td>"
                   f"<td class=\"num\">{value}</td><td>{esc(r.get('target', ''))}</td>"
                   f"<td>{_badge(v, v.split(':')[0])}</td><td>{esc(device_label(c.environment))}<br>"
                   f"<code>{esc(c.path.name)}</code></td></tr>")
    return ('<article class="run recorded"><p class="device">' + _badge("recorded", "recorded") +
            " dlo gpu-check</p><table><tr><th>benchmark</th><th>what</th><th>measured</th><th>target</th>"
            "<th>verdict</th><th>device, file</th></tr>" + "".join(out) + "</table></article>")


# --------------------------------------------------------------------------------------------------
# References: REFERENCES.md's markdown, escaped, then its few marks
# --------------------------------------------------------------------------------------------------

def inline(text: str) -> str:
    t = esc(text)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", t)


def markdown_block(lines: Iterable[str]) -> str:
    """Bullets, tables and paragraphs (the markdown REFERENCES.md uses), every text escaped."""
    out: list[str] = []
    table: list[list[str]] = []
    items: list[str] = []

    def close() -> None:
        if table:
            head, *rest = table
            out.append("<table><tr>" + "".join(f"<th>{inline(c)}</th>" for c in head) + "</tr>" + "".join(
                "<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>" for row in rest) + "</table>")
            table.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for line in lines:
        s = line.strip()
        if s.startswith("|"):
            if items:
                close()
            if not re.fullmatch(r"\|[\s:|-]+\|?", s):
                table.append([c.strip() for c in s.strip("|").split("|")])
        elif s.startswith("- "):
            if table:
                close()
            items.append(s[2:])
        elif s and items and line.startswith(" "):
            items[-1] += " " + s
        else:
            close()
            if s:
                out.append(f"<p>{inline(s)}</p>")
    close()
    return "".join(out)


def references_html(refs: Sequence[Reference]) -> str:
    return "".join(
        f'<article class="run reference"><p class="device">{_badge("reference", "reference")} '
        f"Reference, published, not measured here: {inline(r.heading)}</p>"
        f'<p class="where">from <code>{esc(r.source.name)}</code></p>{markdown_block(r.lines)}</article>'
        for r in refs)


# --------------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------------

def _anchor(notebook: str) -> str:
    return "nb-" + re.sub(r"[^A-Za-z0-9]+", "-", notebook).strip("-")


def notebook_html(report: NotebookReport, page: Path) -> str:
    e = report.entry
    about = f"Day {e.day} · {'core' if e.core else 'going further'} · {e.topic}" if e else "not in the course plan"
    cards = [run_html(r, page) for r in report.runs]
    if not any(r.origin == "run" for r in report.runs):
        where = ", ".join(str(p) for p in report.looked_in) or "no runs folder"
        cards.insert(0, f'<article class="run"><p class="device">Not run yet</p><p class="none">No results.json '
                        f"at {esc(where)}: <code>dlo run {esc(report.notebook)}</code> writes it.</p></article>")
    cards.append(checks_html(report.checks))
    return (f'<section class="notebook" id="{_anchor(report.notebook)}"><h3>{esc(report.notebook)}</h3>'
            f'<p class="meta">{esc(about)}</p><div class="runs">{"".join(cards)}'
            f"{references_html(report.references)}</div></section>")


def _contents(reports: Sequence[NotebookReport]) -> str:
    items = []
    for r in reports:
        ran = sum(x.results is not None for x in r.runs)
        status = f"{ran} run(s)" if ran else "not run yet"
        if any(x.problem for x in r.runs):
            status += ", a file that cannot be read"
        items.append(f'<li><a href="#{_anchor(r.notebook)}">{esc(r.notebook)}</a> ({esc(status)})</li>')
    return "<nav><h2>Notebooks</h2><ul>" + "".join(items) + "</ul></nav>"


def render(reports: Sequence[NotebookReport], problems: Sequence[str], *, sources: Sequence[Path],
           page: Path) -> str:
    """The whole page."""
    now = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    parts = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>Deep Learning Optimisé: results</title><style>{CSS}</style></head><body>",
             "<h1>Deep Learning Optimisé: the notebooks' results</h1>",
             f'<p class="meta">Built {esc(now)} from {esc(", ".join(str(s) for s in sources))}. Each notebook shows '
             "its runs side by side, one card per run and device, the recorded GPU runs beside them, then the "
             "published figures it cites, labelled as references. Medians are followed by their noise band (the "
             "interquartile range of the timed repeats) and its spread (that range over the median).</p>",
             _contents(reports)]
    if problems:
        parts.append("<h2>Files that cannot be shown</h2>" +
                     "".join(f'<p class="problem">{esc(p)}</p>' for p in problems))
    day = None
    for r in reports:
        d = r.entry.day if r.entry else None
        if d != day:
            day = d
            parts.append(f'<h2 id="day-{d}">Day {d}</h2>' if d is not None else "<h2>Other notebooks</h2>")
        parts.append(notebook_html(r, page))
    parts.append("</body></html>\n")
    return "\n".join(parts)
