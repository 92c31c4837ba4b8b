"""`tuner cache export|import|show`: the config cache as a shipped, versioned JSON file; `tuner cache prune`:
remove old, superseded or a kernel's entries and the measurements no entry needs (one transaction), then
optionally VACUUM; `tuner cache upgrade`: upgrade a store of an older tuner's schema in place, which the
commands that only read (`show`, `export`, `prune --dry-run`) refuse to do.

An import validates the whole file against the published JSON Schema (tuner/data/cache-schema.json, with the
`jsonschema` library) and the reader's own checks before it writes anything, then merges in one transaction;
any bad input exits 2 with a one-line reason and leaves the cache as it was. An entry that fails validation
is bad input too (the line names how many and the first few), unless `--skip-invalid` is given: then the
valid entries are imported (or listed, for `show --file`) and the dropped ones are named in one warning on
stderr, which is what the runtime does with a shipped file (`tuner.load_cache`, `TUNER_CACHE_FILE`). A file
that cannot be read at all exits 2 either way. A file whose name ends in .gz is written gzip-compressed,
and read back with a bound on the decompressed size. `--json` prints one JSON document on stdout instead of
the human lines."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tuner._units import from_seconds

from . import check_out_file, kernel_hint


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cache",
        help="export, import, list or prune the tuned-config cache",
        description="The tuned-config cache of the store ($TUNER_HOME/tuner.db by default).",
    )
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    csub.required = True

    e = csub.add_parser("export", help="write every entry to a versioned JSON file (atomically)")
    e.add_argument("--out", required=True, metavar="FILE", help="the file to write (gzip if it ends in .gz)")
    e.add_argument("--kernel", default=None, help="only this kernel's entries")
    e.add_argument("--storage", default=None, metavar="URL", help="database URL (default: the default store)")
    e.add_argument("--json", action="store_true", help='print {"path": ..., "entries": N}')
    e.set_defaults(func=run_export, reads_only="tuner cache export")

    i = csub.add_parser("import", help="validate a cache file, then merge it into the store")
    i.add_argument("file", help="a file written by `tuner cache export` (.json or .json.gz)")
    i.add_argument(
        "--prefer-import",
        action="store_true",
        help="the imported entry replaces an existing one even if that one was measured faster",
    )
    i.add_argument("--storage", default=None, metavar="URL", help="database URL (default: the default store)")
    i.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    i.add_argument("--skip-invalid", action="store_true", help=_SKIP_HELP)
    i.set_defaults(func=run_import)

    s = csub.add_parser("show", help="list the cached entries")
    s.add_argument("--kernel", default=None, help="only this kernel's entries")
    s.add_argument("--json", action="store_true", help="print the entries as a cache file would hold them")
    s.add_argument("--storage", default=None, metavar="URL", help="database URL (default: the default store)")
    s.add_argument("--file", default=None, help="list a cache file (validated) instead of the store")
    s.add_argument("--skip-invalid", action="store_true", help=_SKIP_HELP + " (with --file)")
    s.set_defaults(func=run_show, reads_only="tuner cache show")

    r = csub.add_parser(
        "prune",
        help="remove old, superseded or a kernel's entries, and measurements no entry needs",
        description="Remove the entries that every given selector picks, and with --measurements the "
        "runtime's measurements of keys that have no entry, in one transaction (a failure or Ctrl-C "
        "leaves the store as it was). A study's measurements are never removed.",
    )
    r.add_argument(
        "--older-than",
        type=float,
        default=None,
        metavar="DAYS",
        help="entries measured more than DAYS days ago (a hit does not renew an entry's date)",
    )
    r.add_argument("--kernel", default=None, help="only this kernel's entries (alone: all of them)")
    r.add_argument(
        "--stale",
        action="store_true",
        help="entries superseded by a newer entry of the same kernel, key fields, dtypes and device "
        "(another source hash or other versions)",
    )
    r.add_argument(
        "--measurements",
        action="store_true",
        help="also the measurements runtime tunings recorded for keys without an entry (after this prune), "
        "within --kernel and --older-than",
    )
    r.add_argument("--dry-run", action="store_true", help="print what would go, per kernel; change nothing")
    r.add_argument(
        "--vacuum",
        action="store_true",
        help="then VACUUM: SQLite's file shrinks; PostgreSQL reuses the space (autovacuum does it too)",
    )
    r.add_argument("--storage", default=None, metavar="URL", help="database URL (default: the default store)")
    r.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    r.set_defaults(func=run_prune, reads_only=lambda a: "tuner cache prune --dry-run" if a.dry_run else None)

    u = csub.add_parser(
        "upgrade",
        help="upgrade a store of an older tuner's schema in place",
        description="Upgrade the store's schema (its entries, measurements and studies) to this tuner's, "
        "in one transaction on SQLite, as a command that writes the store does when it opens one; the "
        "commands that only read (cache show, cache export, cache prune --dry-run, study report, study "
        "export) refuse an older store instead. Afterwards, tuner releases of the older schema refuse it: "
        "upgrade every process that shares it together.",
    )
    u.add_argument("--storage", default=None, metavar="URL", help="database URL (default: the default store)")
    u.add_argument("--json", action="store_true", help='print {"store": ..., "upgraded": true|false}')
    u.set_defaults(func=run_upgrade)


_SKIP_HELP = (
    "leave out the entries that fail validation, with one warning naming them, and use the rest "
    "(as the runtime does with a shipped file); without it, one such entry makes the file bad input"
)


def _read_file(path: str, skip_invalid: bool) -> tuple[list[Any], int]:
    """The file's entries and how many were dropped (named in one warning on stderr); BadInput (exit 2,
    one line) when the file cannot be read, or when an entry fails validation and `skip_invalid` is not
    set."""
    from tuner.errors import BadInput
    from tuner.runtime import CacheFileError, read_cache_contents

    try:
        got = read_cache_contents(path)
    except CacheFileError as exc:  # the file cannot be read at all
        raise BadInput(str(exc).splitlines()[0] if str(exc) else "invalid cache file") from None
    if not skip_invalid:
        try:
            return got.strict(), 0
        except CacheFileError as exc:
            raise BadInput(f"{exc} (--skip-invalid uses the valid entries)") from None
    if got.dropped and not got.entries:
        raise BadInput(f"no valid entry: {got.summary()}")
    if got.dropped:
        print(f"tuner: warning: {got.summary()}; left out", file=sys.stderr)
    return got.entries, len(got.dropped)


def _cache(url: str | None) -> Any:
    from tuner.runtime import ConfigCache

    return ConfigCache(url)


def _stored_entries(url: str | None, kernel: str | None) -> list[Any]:
    """The store's entries (of `kernel`) for `show` and `export`, which only read: a store not made yet (a
    SQLite file that does not exist, an empty PostgreSQL database) holds none, and neither it nor
    `$TUNER_HOME` is made by reading it (`no_store_at`)."""
    from tuner.storage import no_store_at
    from tuner.store import default_storage_url, normalize_url

    url = normalize_url(url or default_storage_url(create=False))
    if no_store_at(url):
        return []
    return _cache(url).entries(kernel)


def _stored_kernels(url: str | None) -> list[str]:
    """The kernel names of the store's entries (none when it is not made yet: `no_store_at`)."""
    from tuner.storage import no_store_at
    from tuner.store import default_storage_url, normalize_url

    url = normalize_url(url or default_storage_url(create=False))
    if no_store_at(url):
        return []
    return list(_cache(url).kernel_names())


def run_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tuner.errors import BadInput
    from tuner.runtime import write_cache_file

    check_out_file(args.out, "cache file")
    out = Path(args.out)
    if not out.parent.exists():
        raise BadInput(f"--out {out}: folder {out.parent} does not exist")
    entries = _stored_entries(args.storage, args.kernel)
    if not entries:  # nothing to export is work that did not happen: exit 1, and write no empty file
        what = f" of kernel {args.kernel!r}" if args.kernel else ""
        hint = kernel_hint(args.kernel, _stored_kernels(args.storage)) if args.kernel else ""
        why = f"; {hint}" if hint else " (tune or import first)"
        msg = f"nothing to export: the store holds no cache entry{what}{why}; {out} not written"
        if args.json:
            _print_json({"ok": False, "error": msg, "path": str(out), "entries": 0})
        print(f"tuner: {msg}", file=sys.stderr)
        return 1
    n = write_cache_file(out, entries)
    if args.json:
        _print_json({"path": str(out), "entries": n})
    else:
        print(f"exported {n} entries to {out}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    entries, dropped = _read_file(args.file, args.skip_invalid)  # all validated before the store is opened
    counts = _cache(args.storage).merge(entries, prefer_import=args.prefer_import)
    if args.json:
        doc = {
            "file": str(args.file),
            "entries": counts.total,
            "added": counts.added,
            "replaced": counts.replaced,
            "kept": counts.kept,
        }
        _print_json({**doc, "dropped": dropped} if args.skip_invalid else doc)
        return 0
    left_out = f"; left out {dropped} invalid" if dropped else ""
    print(
        f"imported {args.file}: {counts.total} entries; added {counts.added}, replaced {counts.replaced}, "
        f"kept existing {counts.kept}{left_out}"
    )
    return 0


def run_show(args: argparse.Namespace) -> int:
    hint, where = "", "the store"
    if args.file:
        got, _ = _read_file(args.file, args.skip_invalid)
        entries = sorted(
            (e for e in got if args.kernel is None or e.key.kernel == args.kernel), key=lambda e: e.key.hash
        )
        if args.kernel is not None and not entries:
            hint, where = kernel_hint(args.kernel, sorted({e.key.kernel for e in got})), str(args.file)
    else:
        entries = _stored_entries(args.storage, args.kernel)
        if args.kernel is not None and not entries:
            hint = kernel_hint(args.kernel, _stored_kernels(args.storage))
    if hint:  # on stderr, so that --json's stdout stays one JSON document
        print(f"tuner: warning: {where} holds no entry of kernel {args.kernel!r}; {hint}", file=sys.stderr)
    if args.json:
        _print_json([e.to_json() for e in entries])
        return 0
    if not entries:
        print("no cached entries")
        return 0
    for e in entries:
        k = e.key
        key = ", ".join(f"{n}={v}" for n, v in k.fields)
        cfg = ", ".join(f"{n}={v}" for n, v in e.config.items())
        print(
            f"{k.kernel} [{key}] {'/'.join(k.dtypes) or '-'} on {k.device}: {cfg}  "
            f"{_shown_time(e.time_s, e.spread_s)}  {e.date}"
        )
    print(f"{len(entries)} entries")
    return 0


def _shown_time(time_s: float, spread_s: float) -> str:
    """A time and its spread in the unit that suits the time (`80.5 ms (spread 9.1 ms)`; microseconds
    printed for every entry showed a 0.08 s CPU entry as `8.05e+04 us`)."""
    unit = "s" if time_s >= 1 else "ms" if time_s >= 1e-3 else "us"
    return f"{from_seconds(time_s, unit):.3g} {unit} (spread {from_seconds(spread_s, unit):.2g} {unit})"


def run_prune(args: argparse.Namespace) -> int:
    import math

    from tuner.errors import BadInput
    from tuner.runtime import PruneCounts
    from tuner.storage import no_store_at
    from tuner.store import default_storage_url, normalize_url

    days = args.older_than
    if days is not None and (not math.isfinite(days) or days < 0):
        raise BadInput(f"--older-than {days:g}: give a number of days >= 0")
    if days is None and args.kernel is None and not (args.stale or args.measurements or args.vacuum):
        raise BadInput("nothing to prune: give --older-than DAYS, --kernel NAME, --stale or --measurements")
    prunes = days is not None or args.kernel is not None or args.stale or args.measurements
    url = normalize_url(args.storage or default_storage_url(create=False))
    if no_store_at(url):  # nothing stored: nothing to remove, and no store made by looking
        counts, cache = PruneCounts(dry_run=args.dry_run), None
    else:
        cache = _cache(url)
        counts = (
            cache.prune(
                older_than_days=days,
                kernel=args.kernel,
                stale=args.stale,
                measurements=args.measurements,
                dry_run=args.dry_run,
            )
            if prunes
            else PruneCounts(dry_run=args.dry_run)
        )
    doc = counts.to_json()
    if args.kernel is not None and cache is not None and not counts.kernels():
        hint = kernel_hint(args.kernel, cache.kernel_names())
        if hint:
            print(
                f"tuner: warning: the store holds no entry of kernel {args.kernel!r}; {hint}", file=sys.stderr
            )
    if not args.json and prunes:
        _print_prune(counts)
    if not args.vacuum:
        if args.json:
            _print_json({**doc, "vacuum": None})
        return 0
    if cache is None or args.dry_run:
        if args.json:
            _print_json({**doc, "vacuum": {"ran": False}})
        else:
            print("no store to VACUUM" if cache is None else "would then VACUUM the store")
        return 0
    from tuner.store import StoreError

    try:
        done = cache.store.vacuum()
    except StoreError as exc:  # the removal is committed: say so with the failure
        msg = f"VACUUM failed ({'the removal was committed' if prunes else 'nothing removed'}): {exc}"
        if args.json:
            _print_json({**doc, "vacuum": {"ran": False, "error": msg.splitlines()[0]}})
        print(f"tuner: failed: {msg.splitlines()[0]}", file=sys.stderr)
        return 1
    if args.json:
        _print_json(
            {
                **doc,
                "vacuum": {"ran": True, "bytes_before": done.bytes_before, "bytes_after": done.bytes_after},
            }
        )
    elif done.bytes_before is not None and done.bytes_after is not None:
        print(f"vacuumed: {done.bytes_before / 1e6:.1f} MB -> {done.bytes_after / 1e6:.1f} MB")
    else:
        print("vacuumed (PostgreSQL reuses the space for new rows; the files do not shrink)")
    return 0


def run_upgrade(args: argparse.Namespace) -> int:
    from tuner.errors import BadInput
    from tuner.storage import SCHEMA_REVISION, StoreOutdated, no_store_at, only_reading, redact
    from tuner.store import ResultStore, default_storage_url, normalize_url

    url = normalize_url(args.storage or default_storage_url(create=False))
    # no SQLite file, an empty one, an empty PostgreSQL database: no store to upgrade, and none made here
    missing = no_store_at(url)
    if missing is not None:
        raise BadInput(f"no store at {missing}: nothing to upgrade")
    try:
        with only_reading("tuner cache upgrade"):
            ResultStore(url).engine  # noqa: B018 - at this tuner's schema already: nothing written
        upgraded = False
    except StoreOutdated:
        ResultStore(url)  # opened for writing: migrated in place (one transaction on SQLite)
        upgraded = True
    if args.json:
        _print_json({"store": redact(url), "upgraded": upgraded})
    else:
        done = "upgraded to" if upgraded else "already at"
        print(f"store {redact(url)}: {done} this tuner's schema ({SCHEMA_REVISION})")
    return 0


def _print_prune(c: Any) -> None:
    verb = "would remove" if c.dry_run else "removed"
    if not c.kernels():
        print(f"nothing to prune{' (dry run)' if c.dry_run else ''}")
        return
    for k in c.kernels():
        print(f"  {k}: {c.entries.get(k, 0)} entries, {c.measurements.get(k, 0)} measurements")
    print(f"{verb} {c.total_entries} entries and {c.total_measurements} measurements")


def _print_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, sort_keys=True, indent=1, allow_nan=False)
    print()
