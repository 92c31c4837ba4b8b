"""`tuner study report`: a Markdown and an HTML report of a study, from its database alone.

Per task: the best config and its time, the % of roofline (the kernel's FLOP and byte counts over the
device's peaks in `tuner.search_spaces.devices`: ideal time = max(flops / peak_flops, bytes / peak_bandwidth),
reported as ideal / measured), the convergence curve (best so far against trials, a PNG drawn with
matplotlib's Agg backend), parameter importance (Optuna's fANOVA evaluator, seeded; only with enough
successful trials, at least 8) and the failed trials by status. Times are the executor's unit (milliseconds for
the measurement layer).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import io
import logging
import math
import os
import re
import unicodedata
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner._atomic import atomic_write
from tuner._units import PER_SECOND, to_seconds
from tuner.storage import redact

from ._board import DONE, FAILED, TaskRow, summarize
from ._retry import check_task, own_trials
from ._runner import _result_store, task_trials
from ._spec import StudySpec, StudyTask

if TYPE_CHECKING:  # pragma: no cover
    from tuner.store import TrialCheck

log = logging.getLogger(__name__)

__all__ = ["ReportResult", "write_report", "roofline_fraction"]

# The summary's status of a task the study file lists but the database has no row of.
NO_RESULTS = "no results"

# fANOVA fits a random forest to the trials: with fewer than this many successes it reports noise.
MIN_TRIALS_FOR_IMPORTANCE = 8


@dataclass(frozen=True)
class ReportResult:
    markdown: Path
    html: Path
    images: tuple[Path, ...]


def _peak_flops(device: Any, dtype: str) -> float:
    if dtype in ("float16", "bfloat16"):
        tf = device.peak_tflops_fp16
    elif dtype in ("int8",):
        tf = device.peak_tflops_int8 or device.peak_tflops_fp16
    else:
        tf = device.peak_tflops_fp32
    return float(tf) * 1e12


def roofline_fraction(task: StudyTask, time_s: float) -> tuple[float | None, str]:
    """(ideal time / measured time, note); None with the reason when it cannot be computed."""
    from tuner.search_spaces.devices import DEVICES

    dev = DEVICES.get(task.device)
    if dev is None:
        return None, f"no peaks for device {task.device!r}"
    try:
        from tuner.kernels import get_kernel

        try:
            spec = get_kernel(task.kernel)
        except ValueError:
            return None, "no FLOP/byte counts: not a registered kernel"
        flops = float(spec.flops(task.problem))
        nbytes = float(spec.bytes_moved(task.problem))
    except Exception as exc:  # noqa: BLE001 - unregistered kernel (synthetic test tasks)
        return None, f"no FLOP/byte counts ({str(exc).splitlines()[0][:80]})"
    pf, bw = _peak_flops(dev, task.dtype), dev.peak_bandwidth_gbs * 1e9
    if not (math.isfinite(time_s) and time_s > 0):
        return None, f"the time {time_s!r} s is not a positive number"
    if pf <= 0 or bw <= 0:
        return None, "device peaks unknown"
    ideal = max(flops / pf, nbytes / bw)
    bound = "compute" if flops / pf >= nbytes / bw else "memory"
    return (
        ideal / time_s,
        f"{bound}-bound; {flops / 1e9:.3g} GFLOP, {nbytes / 1e6:.3g} MB over {dev.name} peaks",
    )


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_")[:120]


def image_name(key: str) -> str:
    """The convergence plot's file name: readable, and unique per task key (the slug maps several
    characters to '_' and is truncated, so a hash of the whole key follows it)."""
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:10]
    return f"{_slug(key)[:100]}-{digest}.png"


# What `image_name` names a plot (and nothing a user would name a picture of their own, in practice).
_PLOT_NAME = re.compile(r"[A-Za-z0-9_.-]*-[0-9a-f]{10}\.png")


def _fmt_time(v: float | None, unit: str) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.4g} {unit}"


def _plot_convergence(path: Path, title: str, trials: Sequence[Any], unit: str) -> None:
    # A Figure of its own, not pyplot: the user's backend (matplotlib.use) and their open figures stay as they
    # were (this used to force the "Agg" backend on the whole process).
    from matplotlib.figure import Figure

    xs, vals, best_curve, fail_x = [], [], [], []
    best = math.inf
    for i, t in enumerate(trials, start=1):
        if t.value is not None and math.isfinite(t.value):
            xs.append(i)
            vals.append(t.value)
            best = min(best, t.value)
        else:
            fail_x.append(i)
        best_curve.append(best if math.isfinite(best) else float("nan"))
    fig = Figure(figsize=(5.0, 3.0), dpi=100)
    ax = fig.subplots()
    ax.scatter(xs, vals, s=14, color="#9ab", label="trial", zorder=2)
    ax.step(
        range(1, len(trials) + 1), best_curve, where="post", color="#c33", lw=2, label="best so far", zorder=3
    )
    if fail_x:
        top = max(vals) if vals else 1.0
        ax.scatter(fail_x, [top] * len(fail_x), marker="x", color="#555", s=18, label="failed", zorder=2)
    if vals and min(vals) > 0 and max(vals) / min(vals) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"time ({unit})")
    ax.set_title(title.replace("$", r"\$"), fontsize=8)  # a '$' pair would be read as mathtext
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    png = io.BytesIO()
    with (
        warnings.catch_warnings()
    ):  # a character the font lacks (an emoji of a kernel's name) is drawn as a box
        warnings.filterwarnings("ignore", message="Glyph .* missing from font", category=UserWarning)
        fig.tight_layout()
        fig.savefig(png, format="png")
    atomic_write(path, png.getvalue())


def _importance(storage: Any, study_name: str, n_ok: int) -> tuple[dict[str, float] | None, str]:
    if n_ok < MIN_TRIALS_FOR_IMPORTANCE:
        return None, f"needs at least {MIN_TRIALS_FOR_IMPORTANCE} successful trials (has {n_ok})"
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
        imp = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0))
    except Exception as exc:  # noqa: BLE001 - e.g. a parameter that never varied
        return None, f"not available: {str(exc).splitlines()[0][:120]}"
    return {k: float(v) for k, v in imp.items()}, ""


_MEASURE_ERR = re.compile(r"^MeasurementFailed: ([a-z_]+):")


def _failures(trials: Sequence[Any], result: Mapping[str, Any]) -> Counter[str]:
    """Failed trials by status: the executor's own counts where it kept them (the measurement layer's
    statuses), else from the trials' attributes (`tuner_status`, or the status named in `tuner_error`)."""
    counts = result.get("status_counts")
    if isinstance(counts, Mapping):
        return Counter({str(k): int(v) for k, v in counts.items() if k != "ok" and int(v) > 0})
    out: Counter[str] = Counter()
    for tr in trials:
        if tr.value is not None:
            continue
        status = str(tr.user_attrs.get("tuner_status", "failed"))
        m = _MEASURE_ERR.match(str(tr.user_attrs.get("tuner_error", "")))
        out[m.group(1) if status == "failed" and m else status] += 1
    return out


# A tiny document model rendered to both Markdown and HTML. Its inline text is the report's own prose
# (trusted: it may hold `code` spans of its own) with the values that come from the study file or the
# database (task keys, kernel names, configs, error messages: a study can come from someone else) marked
# by `_code(v)` (a code span) or `_text(v)` (plain text). A marked value is escaped for each output:
# Markdown's own characters, a backtick inside a code span and a '|' inside a table cell keep the
# value as it is, raw HTML stays text, and a newline (any control character) is shown as its escape
# (`\n`) so a table row or a heading stays one line.
Block = tuple[Any, ...]

_CODE_OPEN, _CODE_CLOSE, _TEXT_OPEN, _TEXT_CLOSE = "\x02", "\x03", "\x04", "\x05"
_MARKED = re.compile("\x02([^\x03]*)\x03|\x04([^\x05]*)\x05")
_CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Markdown's inline syntax characters, escaped with a backslash in a plain value ('_' only where it can
# start or end emphasis: inside a word, as in flash_attention, it cannot, and stays readable).
_MD_SPECIAL = set("\\`*[]<>&#~|!$")


def _visible(v: Any) -> str:
    """`v` as one line: control characters (and the line and paragraph separators) as escapes."""
    out = []
    for ch in str(v):
        if unicodedata.category(ch) == "Cc" or ch in "\u2028\u2029":
            out.append(_CONTROL_ESCAPES.get(ch) or f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def _code(v: Any) -> str:
    """A value of the study or the database, shown as a code span."""
    return _CODE_OPEN + _visible(v) + _CODE_CLOSE


def _text(v: Any) -> str:
    """A value of the study or the database, shown as plain text."""
    return _TEXT_OPEN + _visible(v) + _TEXT_CLOSE


def _plain(s: str) -> str:
    """Inline text without its marks (for an HTML attribute or an anchor)."""
    return _MARKED.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), s)


def _md_code(c: str, table: bool) -> str:
    if table:
        c = c.replace("|", "\\|")  # GFM reads a '\|' in a cell as the cell's '|', in a code span too
    if not c:
        return "` `"
    fence = "`" * (max((len(r) for r in re.findall("`+", c)), default=0) + 1)
    pad = " " if c[0] in "` " or c[-1] in "` " else ""  # CommonMark strips one space of each side
    return f"{fence}{pad}{c}{pad}{fence}"


def _md_text(t: str) -> str:
    out = []
    for i, ch in enumerate(t):
        if ch in _MD_SPECIAL:
            out.append("\\" + ch)
        elif ch == "_" and not (0 < i < len(t) - 1 and t[i - 1].isalnum() and t[i + 1].isalnum()):
            out.append("\\_")
        else:
            out.append(ch)
    return "".join(out)


def _md_inline(s: str, *, table: bool = False) -> str:
    out, pos = [], 0
    for m in _MARKED.finditer(s):
        own = s[pos : m.start()]
        out.append(own.replace("|", "\\|") if table else own)
        out.append(_md_code(m.group(1), table) if m.group(1) is not None else _md_text(m.group(2)))
        pos = m.end()
    own = s[pos:]
    out.append(own.replace("|", "\\|") if table else own)
    return "".join(out)


def _md(blocks: Sequence[Block]) -> str:
    out = []
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + _md_inline(b[1]) + "\n")
        elif kind == "p":
            out.append(_md_inline(b[1]) + "\n")
        elif kind == "code":
            out.append("```\n" + b[1] + "\n```\n")
        elif kind == "img":
            out.append(f"![{_md_inline(b[2])}]({b[1]})\n")
        elif kind == "table":
            head, rows = b[1], b[2]
            lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
            lines += ["| " + " | ".join(_md_inline(str(c), table=True) for c in r) + " |" for r in rows]
            out.append("\n".join(lines) + "\n")
    return "\n".join(out)


def _html(blocks: Sequence[Block], title: str) -> str:
    e = html.escape
    out = [
        "<!doctype html>",
        "<html><head><meta charset='utf-8'>",
        f"<title>{e(_plain(title))}</title>",
        "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:3px 6px}"
        "th{background:#f4f4f4}code,pre{background:#f6f6f6}</style>",
        "</head><body>",
    ]
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2", "h3"):
            anchor = _slug(_plain(b[1]))
            out.append(f"<{kind} id='{e(anchor)}'>{_inline_html(b[1])}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{_inline_html(b[1])}</p>")
        elif kind == "code":
            out.append(f"<pre>{e(b[1])}</pre>")
        elif kind == "img":
            out.append(f"<img src='{e(b[1])}' alt='{e(_plain(b[2]))}'>")
        elif kind == "table":
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in b[1]) + "</tr>")
            out += ["<tr>" + "".join(f"<td>{_inline_html(str(c))}</td>" for c in r) + "</tr>" for r in b[2]]
            out.append("</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _own_html(s: str) -> str:
    """The report's own prose: escaped, its `code` spans rendered."""
    parts = html.escape(s).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def _inline_html(s: str) -> str:
    """Inline text as HTML: the report's own prose with its `code` spans, the marked values escaped."""
    out, pos = [], 0
    for m in _MARKED.finditer(s):
        out.append(_own_html(s[pos : m.start()]))
        if m.group(1) is not None:
            out.append(f"<code>{html.escape(m.group(1))}</code>")
        else:
            out.append(html.escape(m.group(2)))
        pos = m.end()
    out.append(_own_html(s[pos:]))
    return "".join(out)


def _config_str(cfg: Mapping[str, Any] | None) -> str:
    return "-" if not cfg else ", ".join(f"{k}={v}" for k, v in sorted(cfg.items()))


def _check_text(check: TrialCheck) -> str:
    """The report's note on a task whose counted trials and stored measurements disagree."""
    parts = []
    if check.unmeasured:
        nums = ", ".join(str(n) for n in check.unmeasured[:20]) + (
            ", ..." if len(check.unmeasured) > 20 else ""
        )
        parts.append(
            f"{len(check.unmeasured)} counted trial(s) have no measurement in the results store (Optuna "
            f"trial numbers {nums}), as an older tuner that told Optuna before recording the measurement "
            "(or an executor that records none) leaves them. They count with the value Optuna kept; tuner "
            "does not make up measurements for them"
        )
    if check.unmatched_measurements:
        parts.append(
            f"{check.unmatched_measurements} stored measurement(s) belong to no counted trial (a worker "
            "that lost its lease, under a tuner before lease-fenced measurements)"
        )
    return "Store check: " + "; ".join(parts) + "."


def write_report(spec: StudySpec, out_dir: str | os.PathLike[str]) -> ReportResult:
    """Write `report.md`, `report.html` and one convergence PNG per task into `out_dir`."""
    out = Path(out_dir)
    img_dir = out / "img"
    from ._export import NothingToDo
    from ._runner import study_rows

    rows: list[TaskRow] = study_rows(spec)  # tasks removed from the study file are left out
    if not any(r.status in (DONE, FAILED) or r.trials_done for r in rows):
        c = summarize(rows)
        raise NothingToDo(
            f"study {spec.name} has no task that ran: nothing to report "
            f"({c['pending']} pending, {c['running']} running; run `tuner study run` first)"
        )
    try:
        img_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(img_dir, os.W_OK):
            raise PermissionError(13, "Permission denied", str(img_dir))
    except OSError as exc:
        from ._export import OutputNotWritable

        raise OutputNotWritable(
            f"cannot write the report of study {spec.name} into {out}: {exc.strerror or exc}; "
            "give a folder that can be written with --out DIR (the study's database is only read)"
        ) from exc
    stored = {r.key for r in rows}
    unstored = [t for t in spec.tasks if t.key not in stored]  # listed, but never ran under this key
    store = _result_store(spec.storage)
    storage = store.optuna_storage()
    inconsistent: list[str] = []
    counts = summarize(rows)
    redacted = redact(spec.storage)
    blocks: list[Block] = [
        ("h1", f"Study {_text(spec.name)}"),
        (
            "p",
            f"Generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC} from {_code(redacted)} by "
            f"`tuner study report`. Tasks: {counts[DONE]} done, {counts['failed']} failed, "
            f"{counts['pending']} pending, {counts['running']} running"
            + (f", {len(unstored)} with no results in the database." if unstored else "."),
        ),
        (
            "p",
            "Best time: the winner's time as the executor chose it (for the measurement layer, the median of "
            "the finalists' interleaved re-measurement), which can differ from the best single trial that "
            "the convergence curve shows. % of roofline: max(FLOPs / peak FLOP/s, bytes / peak bandwidth) "
            "over the measured time, with the peaks of the task's device in search_spaces.devices.",
        ),
    ]
    summary_rows = []
    sections: list[Block] = []
    images = []
    for r in rows:
        t = r.task
        res = r.result or {}
        unit = str(res.get("unit", "ms"))
        trials = task_trials(storage, t.study_name)
        trials.sort(key=lambda tr: tr.number)
        ok = [tr for tr in trials if tr.value is not None]
        best_value = res.get("best_value", r.best_value)
        best_config = res.get("best_config", r.best_config)
        if best_value is None and ok:
            b = min(ok, key=lambda tr: tr.value)
            best_value, best_config = b.value, dict(b.params)
        if not best_value:
            frac, note = None, "no successful trial"
        elif unit not in PER_SECOND:  # an executor's own unit: shown as it is, not converted
            frac, note = None, f"time unit {unit!r} is none of {', '.join(PER_SECOND)}"
        else:
            frac, note = roofline_fraction(t, to_seconds(float(best_value), unit))
        roof = f"{frac * 100:.3g} %" if frac is not None else "n/a"
        failures = _failures(trials, res)
        summary_rows.append(
            [
                _code(t.key),
                _text(r.status),
                f"{len(trials)}/{t.budget or '-'}",
                _fmt_time(best_value, unit),
                roof,
                _code(_config_str(best_config)),
            ]
        )
        sections.append(("h2", _text(t.key)))
        sections.append(
            (
                "p",
                f"Kernel {_code(t.kernel)}, backend {_code(t.backend)}, dtype {_code(t.dtype)}, device "
                f"{_code(res.get('device_name', t.device))}, strategy {_code(t.strategy)}, seed {t.seed}; "
                f"status {_text(r.status)} after {r.attempts} attempt(s), {len(trials)} trials, "
                f"{r.spent_s:.1f} s.",
            )
        )
        if t.retries:
            carried = len(trials) - len(own_trials(trials))
            sections.append(
                (
                    "p",
                    f"Retried {t.retries} time(s) (`--retry-failed`): trials in Optuna study "
                    f"{_code(t.study_name)}, {carried} of them the earlier attempts' successes (not measured "
                    "again); the earlier attempts' failed trials stay in their own studies and are not "
                    "counted here.",
                )
            )
        if r.error:
            sections.append(("p", f"Error: {_code(r.error.splitlines()[0][:300])}"))
        sections.append(
            (
                "table",
                ["best config", "time", "% of roofline"],
                [
                    [
                        _code(_config_str(best_config)),
                        _fmt_time(best_value, unit),
                        f"{roof} ({_text(note)})" if note else roof,
                    ]
                ],
            )
        )
        if trials:
            png = img_dir / image_name(t.key)
            try:
                _plot_convergence(png, f"{spec.name}: {_visible(t.key)}", trials, unit)
                images.append(png)
                sections.append(("img", f"img/{png.name}", f"convergence of {_text(t.key)}"))
            except Exception as exc:  # noqa: BLE001 - a plot must not lose the rest of the report
                log.warning("plot of %s failed: %s", t.key, exc)
        imp, why = _importance(storage, t.study_name, len(ok))
        if imp:
            sections.append(
                ("p", f"Parameter importance (Optuna's fANOVA evaluator over {len(ok)} successful trials):")
            )
            sections.append(
                (
                    "table",
                    ["parameter", "importance (fANOVA)"],
                    [[_code(k), f"{v:.3f}"] for k, v in imp.items()],
                )
            )
        else:
            sections.append(("p", f"Parameter importance: {why}."))
        if failures:
            sections.append(
                ("table", ["failure status", "trials"], [[_text(k), v] for k, v in sorted(failures.items())])
            )
        else:
            sections.append(("p", "No failed trials."))
        checks = check_task(store, storage, t)
        if checks:
            inconsistent.append(t.key)
        for name, check in checks:
            sections.append(
                ("p", _check_text(check) + (f" (Optuna study {_code(name)})" if t.retries else ""))
            )
    for t in unstored:
        summary_rows.append([_code(t.key), NO_RESULTS, f"0/{t.budget or '-'}", "-", "n/a", "`-`"])
        sections.append(("h2", _text(t.key)))
        sections.append(
            (
                "p",
                f"Kernel {_code(t.kernel)}, backend {_code(t.backend)}, dtype {_code(t.dtype)}: no results in the study's "
                "database; the task never ran under this key (`tuner study run` runs it).",
            )
        )
    if inconsistent:
        blocks.append(
            (
                "p",
                f"Store check: the trials and the stored measurements of {len(inconsistent)} task(s) "
                f"disagree ({', '.join(_code(k) for k in inconsistent)}); see their sections.",
            )
        )
    blocks.append(("h2", "Summary"))
    blocks.append(
        ("table", ["task", "status", "trials", "best time", "% of roofline", "best config"], summary_rows)
    )
    blocks += sections
    md_path, html_path = out / "report.md", out / "report.html"
    atomic_write(md_path, _md(blocks))
    atomic_write(html_path, _html(blocks, f"Study {_text(spec.name)}"))
    # Then the plots of tasks no longer in the study, once no report refers to them: only files named as
    # this module names its plots (`image_name`), not whatever else a folder given with --out holds.
    for old in img_dir.glob("*.png"):
        if old not in images and _PLOT_NAME.fullmatch(old.name):
            old.unlink(missing_ok=True)
    return ReportResult(md_path, html_path, tuple(images))
