"""``aspc report``: PNG figures and one HTML page for a plan and its run logs.

matplotlib (the ``report`` extra) is imported only when figures are drawn;
importing this package costs nothing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from aspc.atomic import atomic_dir
from aspc.errors import ConfigError
from aspc.file_modes import current_umask
from aspc.progress import NULL_PROGRESS, Progress

__all__ = ["write_report"]

INDEX = "index.html"
# Names of files: a new report directory is not given one.
_FILE_SUFFIXES = (".parquet", ".pq", ".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".txt", ".html", ".htm", ".png",
                  ".pdf", ".gz", ".zip")


# Embeddings, overrides, isolates and marks that reorder the text around them (Unicode's Bidi_Control).
_BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _check_out_dir(out_dir: Path) -> None:
    """Refuse to replace a directory that is not an earlier aspc report (it would be deleted)."""
    if not out_dir.exists():
        if out_dir.suffix.lower() in _FILE_SUFFIXES:
            # A directory called rep.parquet or report.html passed for a file with every other tool.
            raise ConfigError(f"-o {out_dir.name}: a report is a directory (index.html and its figures), not a "
                              f"{out_dir.suffix} file; name a directory, e.g. -o {out_dir.stem}/")  # fmt: skip
        return
    if not out_dir.is_dir():
        raise ConfigError(f"-o {out_dir}: exists and is not a directory; pick a new report directory")
    if (why := _replace_refusal(out_dir, out_dir)) is not None:
        raise ConfigError(why)


def _replace_refusal(d: Path, out_dir: Path, *, at_swap: bool = False) -> str | None:
    """Why directory ``d`` (``-o out_dir``, or its earlier content moved aside) must not be replaced; None: it may.

    ``at_swap``: asked again as the report replaces it, where a file that appeared meanwhile is named first.
    """
    from aspc.report.figures import PLAN_FIGURES, RUN_FIGURES
    from aspc.report.html import GENERATOR

    if not any(d.iterdir()):
        return None
    # A report is index.html and its figures, by their own names: any other file, a PNG the user put
    # there too, is theirs (run logs copied beside a report: replaced whole, they went with it).
    own = {INDEX} | {s.file for s in (*PLAN_FIGURES, *RUN_FIGURES)}
    extra = sorted(p.name for p in d.iterdir() if not (p.is_file() and p.name in own))
    if extra and at_swap:
        return (f"-o {out_dir}: {extra[0]!r} was put there while the report was drawn, and writing the report "
                "would delete it; nothing was replaced: move it out, or pick a new directory")  # fmt: skip
    index = d / INDEX
    try:
        head = index.read_text(encoding="utf-8", errors="replace")[:2000] if index.is_file() else ""
    except OSError:
        head = ""
    if f'name="generator" content="{GENERATOR}' not in head:
        return (f"-o {out_dir}: directory exists and is not an aspc report; pick a new directory "
                "(an earlier report there would be replaced, anything else is never deleted)")  # fmt: skip
    if extra:
        return (f"-o {out_dir}: holds {extra[0]!r}, which is no part of an aspc report and writing "
                "the report would delete; move it out, or pick a new directory")  # fmt: skip
    return None


def _shown(name: str) -> str:
    """``name`` as the page and the figures print it: bytes that are not UTF-8 (legal in a Linux name) as U+FFFD.

    Python holds them as lone surrogates, which the UTF-8 page and matplotlib's labels refused (a traceback).
    Bidirectional controls (legal too) are shown as their escapes: U+202E in one run's name reversed the
    names after it on the page, and a <title> cannot isolate it.
    """
    return _BIDI_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}",
                              name.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))  # fmt: skip


def write_report(
    plan_path: str | os.PathLike,
    run_dirs: list[str | os.PathLike] | tuple[str | os.PathLike, ...] = (),
    out_dir: str | os.PathLike = "report",
    progress: Progress = NULL_PROGRESS,
    *,
    embed: bool = False,
) -> list[Path]:
    """Draw the report of a plan (and optional run logs) into ``out_dir``.

    Parameters
    ----------
    plan_path
        A plan written by ``aspc compile``.
    run_dirs
        Run log directories written by ``aspc run --log`` from this plan, or
        from other plans of the same prompts (one per strategy, say: their
        observed lengths are drawn against this plan's predictions); several
        are overlaid in the same figures (legend: directory name), each once.
    out_dir
        Report directory, written whole or not at all. An earlier aspc report
        there is replaced; any other non-empty directory is refused.
    progress
        Receives the stages ``read``, ``figures`` and ``html``.
    embed
        Inline the PNGs into ``index.html`` as base64 data URIs (the PNG files
        are written too).

    Returns
    -------
    list of Path
        ``out_dir/index.html`` then every PNG, in page order.

    Raises
    ------
    AspcError
        matplotlib missing (install ``aspc[report]``), an unreadable plan or
        one edited by hand (rows and stored metrics disagree, as ``aspc inspect``
        refuses), an unreadable run log, a run log that shares no prompt with
        the plan, one given twice, or an unusable ``out_dir``.
    """
    from aspc.emit import read_plan, verify_integrity
    from aspc.report import figures as F
    from aspc.report.canvas import literal_text
    from aspc.report.data import plan_view, run_labels, run_view
    from aspc.runtime.record.runlog import read_run_log

    F.require_matplotlib()  # fail before any work when the extra is missing
    plan_path, out_dir = Path(plan_path), Path(out_dir)
    run_paths = [Path(r) for r in run_dirs]
    seen: dict[Path, Path] = {}
    for r in run_paths:
        if (key := r.resolve()) in seen:
            same = "given twice" if r == seen[key] else f"the same run log as {seen[key]}"
            raise ConfigError(f"{r}: {same}; name each run once")
        seen[key] = r
    _check_out_dir(out_dir)

    progress.stage("read", total=1 + len(run_paths))
    plan = read_plan(plan_path)
    # The page shows the stored metrics beside figures drawn from the rows: as inspect does, they must agree.
    verify_integrity(plan, plan_path.name)
    pv = plan_view(plan, _shown(plan_path.name))
    progress.advance()
    runs = []
    for path, label in zip(run_paths, run_labels(run_paths), strict=True):
        # A failed or interrupted run is still worth looking at; its status is shown.
        runs.append(run_view(pv, read_run_log(path, allow_incomplete=True), _shown(label)))
        progress.advance()
    progress.done()

    specs = list(F.PLAN_FIGURES) + (list(F.RUN_FIGURES) if runs else [])
    # Asked again at the swap: a file put into out_dir while the figures were drawn is not deleted.
    with atomic_dir(out_dir, refuse=lambda d: _replace_refusal(d, out_dir, at_swap=True)) as tmp:
        # The temporary directory is private (0700); a report is meant to be shared like any directory.
        os.chmod(tmp, 0o777 & ~current_umask())
        progress.stage("figures", total=len(specs))
        with literal_text():
            for spec in F.PLAN_FIGURES:
                spec.draw(pv, tmp / spec.file)
                progress.advance()
            if runs:
                for spec in F.RUN_FIGURES:
                    spec.draw(pv, runs, tmp / spec.file)
                    progress.advance()
        progress.done()
        progress.stage("html")
        (tmp / INDEX).write_text(_page(pv, runs, tmp, embed), encoding="utf-8")
        progress.done()
    return [out_dir / INDEX] + [out_dir / s.file for s in specs]


def _scalars(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict):
        return {}
    return {k: v for k, v in d.items() if isinstance(v, (int, float, str, bool)) and v is not None}


def _page(pv: Any, runs: list[Any], tmp: Path, embed: bool) -> str:
    from aspc.report import figures as F
    from aspc.report import html as H

    plan_figs = "".join(H.figure_html(tmp / s.file, s.title, s.caption, embed) for s in F.PLAN_FIGURES)
    predictor = _scalars(pv.predictor)
    sections = [
        (
            "plan",
            "Plan",
            "<h3>Metrics</h3>"
            + H.kv_table(_scalars(pv.metrics))
            + "<h3>Compile configuration</h3>"
            + H.kv_table(_scalars(pv.config) | {f"predictor.{k}": v for k, v in predictor.items()}, "setting")
            + plan_figs,
        )
    ]
    if runs:
        from aspc.report.canvas import page_label

        names = [page_label(r.name) for r in runs]  # the tag a cut legend label ends in, beside the whole name
        keys: list[str] = []
        for r in runs:
            keys += [k for k in r.extra if k not in keys]
        rows = {k: [r.extra.get(k, "") for r in runs] for k in keys}
        configs = [_scalars(r.meta.get("config")) for r in runs]
        cfg_rows = {k: [c.get(k, "") for c in configs] for k in sorted({k for c in configs for k in c})}
        run_figs = "".join(H.figure_html(tmp / s.file, s.title, s.caption, embed) for s in F.RUN_FIGURES)
        sections.append(
            (
                "runs",
                "Runs",
                "<h3>Run metrics</h3>"
                + H.compare_table(names, rows)
                + ("<h3>Run configuration</h3>" + H.compare_table(names, cfg_rows, "setting") if cfg_rows else "")
                + run_figs,
            )
        )
    import pyarrow.compute as pc

    from aspc.emit import schema as S
    from aspc.io.table import string_column

    # A rolling scout's plan holds a scout row beside each scouted prompt: work of that run, no prompt.
    ids = string_column(pv.prompt_ids.tolist())  # not pa.array: that imports pandas
    n_scout = int(pc.sum(pc.ends_with(ids, S.SCOUT_ID_SUFFIX)).as_py() or 0)
    rows = f"{pv.predicted.size - n_scout:,} prompts" + (f" (+ {n_scout:,} scout rows)" if n_scout else "")
    sub = f"plan {pv.name}: {rows}, {pv.n_minibatches:,} minibatches, {pv.n_groups:,} groups"
    if runs:
        sub += "; runs: " + ", ".join(names)
    return H.render_page(title=f"aspc report: {pv.name}", subtitle=sub, sections=sections)
