"""The study report as users with messy studies meet it: names and values that Markdown or HTML would read
as markup (a study file and its database can come from someone else), timings in units the report cannot
convert, and a report folder that holds other files. The executor is the synthetic one of
tests/_study_fake.py (real `tuner.optimize`, real storage)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from tuner.studies._export import NothingToDo

FAKE = "tests._study_fake:executor"

# Kernel names that are markup: raw HTML, a backtick (ends a code span), a '|' (ends a table cell), a
# newline (ends a table row or a heading), Markdown's heading and emphasis characters, and unicode.
NASTY = [
    "k<script>alert('x')</script>",
    "pipe|kern`tick <b>bold</b>",
    "line\nbreak <i>x</i>",
    "_emph_ *star* [link](http://x) ünïcødé 🚀 $a$",
]


def _study(tmp: Path, kernels: list[str], *, budget: int = 2) -> Path:
    p = tmp / "s.toml"
    tasks = "".join(
        f"\n[[tasks]]\nkernel = {json.dumps(k, ensure_ascii=False)}\nproblems = [{{ M = 64, N = 64, K = 64 }}]\n"
        for k in kernels
    )
    p.write_text(
        f"""
[study]
name = "s"
device = "cpu"
budget = {{ trials = {budget} }}
strategy = "random"
output = "out"
{tasks}""",
        encoding="utf-8",
    )
    return p


def _cells(tokens: list) -> list[list[str]]:
    """The table rows of parsed Markdown, each as its cells' inline text."""
    rows, row, in_cell = [], [], False
    for t in tokens:
        if t.type == "tr_open":
            row = []
        elif t.type in ("td_open", "th_open"):
            in_cell = True
        elif t.type == "inline" and in_cell:
            row.append(t.content)
            in_cell = False
        elif t.type == "tr_close":
            rows.append(row)
    return rows


def test_names_that_are_markup_stay_text_in_the_markdown_and_the_html(tmp_path: Path) -> None:
    from tuner.studies import load_study, run_study, write_report

    spec = load_study(_study(tmp_path, NASTY), check_kernels=False)
    run_study(spec, executor=FAKE)
    rep = write_report(spec, tmp_path / "rep")
    md_text = rep.markdown.read_text(encoding="utf-8")
    md = MarkdownIt("commonmark").enable("table")
    rendered = md.render(md_text)
    assert not re.search(r"<(script|b|i|em|strong|a)[ >]", rendered), rendered  # no markup of the names'
    tokens = md.parse(md_text)
    rows = _cells(tokens)
    summary = [r for r in rows if len(r) == 6]
    assert len(summary) == 1 + len(NASTY), summary  # one row per task: no row broken by a '|' or newline
    assert all(len(r) in (2, 3, 6) for r in rows), rows
    codes = [
        c.content for t in tokens if t.type == "inline" for c in t.children or [] if c.type == "code_inline"
    ]
    for k in NASTY:
        shown = k.replace("\n", "\\n")  # a newline is shown as its escape: a key stays one line
        assert shown in codes, (k, codes)  # the whole kernel name in one code span
        assert any(c.startswith(shown + "/triton/") for c in codes), k  # and the whole key
    headings = [
        tokens[i + 1].children for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"
    ]
    texts = ["".join(c.content for c in h or [] if c.type == "text") for h in headings]
    for k in NASTY:
        assert any(x.startswith(k.replace("\n", "\\n") + "/triton/") for x in texts), (k, texts)

    page = rep.html.read_text(encoding="utf-8")
    assert not re.search(r"<(script|b|i)>", page)
    for k in NASTY:
        esc = k.replace("\n", "\\n").replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        esc = esc.replace("'", "&#x27;")
        assert f"<code>{esc}</code>" in page, k  # a backtick in a name does not end its code element


def ns_executor(task, *, prior=None, callback=None):  # type: ignore[no-untyped-def]
    """The synthetic executor, its result's times said to be nanoseconds (an executor's own unit)."""
    from types import SimpleNamespace

    from tests._study_fake import executor

    res = executor(task, prior=prior, callback=callback)
    return SimpleNamespace(best_config=res.best_config, best_value=res.best_value, unit="ns")


def test_a_time_unit_the_report_cannot_convert_is_shown_not_a_crash(tmp_path: Path) -> None:
    """An executor's result in a unit tuner does not convert (ns) used to end the report (and `study run`
    after its tuning) with `ValueError: unknown time unit`; the export left that task out no better."""
    from tuner.studies import export_study, load_study, run_study, write_report

    p = _study(tmp_path, ["mm"])
    spec = load_study(p, check_kernels=False)
    run_study(spec, executor="tests.test_study_report:ns_executor")
    (row,) = _rows(spec)
    md = write_report(spec, tmp_path / "rep").markdown.read_text(encoding="utf-8")
    assert f"| {row.best_value:.4g} ns | n/a |" in md, md
    assert "time unit 'ns' is none of s, ms, us" in md
    with pytest.raises(NothingToDo):  # its only task cannot be written in seconds: nothing to export
        export_study(spec, tmp_path / "c.json")


def _rows(spec):  # type: ignore[no-untyped-def]
    from tuner.studies._runner import study_rows

    return study_rows(spec)


def test_a_report_into_a_folder_of_other_files_removes_only_its_own_stale_plots(tmp_path: Path) -> None:
    """`--out DIR` into a folder that already holds pictures: the report removes the plots of tasks no
    longer in the study, and used to remove every other PNG of DIR/img as well."""
    from tuner.studies import load_study, run_study, write_report
    from tuner.studies._report import image_name

    spec = load_study(_study(tmp_path, ["mm"]), check_kernels=False)
    run_study(spec, executor=FAKE)
    img = tmp_path / "rep" / "img"
    img.mkdir(parents=True)
    mine = img / "diagram.png"
    mine.write_bytes(b"\x89PNG not the report's")
    stale = img / image_name("gone/triton/float32/M=1")  # a plot of a task no longer in the study
    stale.write_bytes(b"\x89PNG")
    rep = write_report(spec, tmp_path / "rep")
    assert mine.read_bytes() == b"\x89PNG not the report's"
    assert not stale.exists()
    assert sorted(p.name for p in img.iterdir()) == sorted([mine.name, *(p.name for p in rep.images)])


def negated_executor(task, *, prior=None, callback=None):  # type: ignore[no-untyped-def]
    """The synthetic executor, its best value negated (an executor that reports -GFLOP/s)."""
    from types import SimpleNamespace

    from tests._study_fake import executor

    res = executor(task, prior=prior, callback=callback)
    return SimpleNamespace(best_config=res.best_config, best_value=-res.best_value, unit="ms")


def test_export_says_why_a_task_is_left_out_and_which_entry_it_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A negative best value was left out as 'has no successful config' (it had one), and an entry the
    importer refuses was named by its kernel only ('entry mm'), not by the task it came from."""
    import logging

    from tuner.runtime import _entry
    from tuner.studies import export_study, load_study, run_study
    from tuner.studies._export import ExportRefused

    p = _study(tmp_path, ["mm"])
    spec = load_study(p, check_kernels=False)
    run_study(spec, executor="tests.test_study_report:negated_executor")
    with caplog.at_level(logging.WARNING, logger="tuner"), pytest.raises(NothingToDo):
        export_study(spec, tmp_path / "c.json")
    assert "is not a positive time; not exported" in caplog.text
    assert "no successful config" not in caplog.text

    (tmp_path / "b").mkdir()
    q = _study(tmp_path / "b", ["mm"])
    spec = load_study(q, check_kernels=False)
    run_study(spec, executor=FAKE)

    def refusing(e, *, where):  # type: ignore[no-untyped-def]
        raise _entry.EntryError(f"{where}: refused for the test")

    monkeypatch.setattr(_entry, "entry_from_json", refusing)
    with pytest.raises(ExportRefused) as err:
        export_study(spec, tmp_path / "d.json")
    (row,) = _rows(spec)
    assert "the entry of mm {" in str(err.value) and "'M': 64" in str(err.value), err.value
