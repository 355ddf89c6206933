"""The command line's compile commands: `warm` (fill the compile cache, a part at a time if
need be) and `tuning export | import | show` (max-autotune's tuning as data). Parsed here, added
to cli.py's parser. (The reference run, this project's own GPU measurements, is
tools/reference/, outside the package.)

Introduced in 05_cold_start.ipynb (warm, tuning).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ... import checks
from ..planning.compile_cache import use_course_cache
from ..planning.ladders import LADDERS
from ..compiletime.cold_start import check_artifacts_path, load_artifacts
from ..planning import clock
from ..compiletime.bundle import bundle_path
from ..compiletime.bundle_cache import import_raw
from ..compiletime.bundle_io import export_tuning, import_matching, import_tuning, show_tuning
from .warm import PARTS, warm_ladder
from ..planning.writes import output_folder

__all__ = ["COMPILE_COMMANDS", "add_compile_commands", "UsageError"]


class UsageError(Exception):
    """Invalid command-line input (argparse's own errors included)."""


def _tuning_flags(p: argparse.ArgumentParser, writes: str) -> None:
    p.add_argument("--tuning-root", default="results", metavar="DIR",
                   help="import every tuning bundle of this GPU kind and torch build under "
                        "DIR/*/tuning/<torch>/ before compiling (default: results)"
                        + writes)
    p.add_argument("--no-tuning", action="store_true",
                   help="neither import nor write tuning bundles")


def add_compile_commands(sub, common, steps: list[str]) -> None:
    """warm, tuning and clock, on cli.py's subparsers (`common`: its shared flags)."""
    warm = sub.add_parser("warm", help="compile a ladder's compiled steps once (fill the "
                          "compile cache, keep max-autotune's tuning as a bundle), optionally "
                          "into a portable file; or --load one")
    common(warm)
    warm.add_argument("--ladder", default=None, choices=sorted(LADDERS),
                      help="default: the model's own (blog, or flux for Flux)")
    warm.add_argument("--only", action="append", default=None, metavar="STEP", choices=steps,
                      help="warm only this step (repeatable)")
    warm.add_argument("--part", default="all", choices=PARTS,
                      help="compile only the denoiser or only the VAE decode, with the inputs "
                           "the pipeline gives it (each part's tuning in its own command)")
    warm.add_argument("--out", default=None, help="write the compiled artifacts to this file")
    warm.add_argument("--load", default=None, metavar="FILE",
                      help="load a file written by --out into this machine's compile cache. "
                           "It holds code that will run (as any pickle): load only files from "
                           "someone you trust, with --sha256")
    warm.add_argument("--sha256", default=None, metavar="HEX",
                      help="with --load: the SHA-256 that --out printed; a file that does not "
                           "match is refused before anything in it is read")
    _tuning_flags(warm, "; what this command tunes grows DIR/<gpu>/tuning/<torch>/<model>"
                  ".json.gz (every 30 s, at the end, when stopped)")

    tuning = sub.add_parser("tuning", help="max-autotune's tuning as data: export the compile "
                            "cache's tuning to a bundle, import one, show one")
    verbs = tuning.add_subparsers(dest="verb", required=True, parser_class=sub._parser_class)
    export = verbs.add_parser("export", help="write (or grow) a bundle from the compile cache")
    export.add_argument("--out", required=True, metavar="FILE", help="e.g. results/h100-80gb-"
                        "hbm3/tuning/2.11.0+cu130/sdxl.json.gz (fdh.course.bundle_path)")
    export.add_argument("--model", default=None, help="the model the tuning is for (leaves "
                        "out what another model's bundle brought unchanged)")
    export.add_argument("--cache-dir", default=None, help="default: the course's cache folder")
    imp = verbs.add_parser("import", help="put bundles' tuning into the compile cache")
    imp.add_argument("files", nargs="*", metavar="FILE")
    imp.add_argument("--matching", default=None, metavar="DIR",
                     help="import every bundle under DIR/*/tuning/<this torch>/ whose stamp is "
                          "this machine's (what warm and reference do first)")
    imp.add_argument("--sha256", default=None, metavar="HEX",
                     help="the SHA-256 that export printed (one FILE); refused if it differs")
    imp.add_argument("--cache-dir", default=None, help="default: the course's cache folder")
    imp.add_argument("--from-kind", default=None, metavar="GPU",
                     help="the FILE(s) were tuned on this other GPU kind of the same design "
                          "(e.g. 'NVIDIA H200' on an H100 SXM: the same SM count and compute "
                          "capability, checked): take its tuning, say so, and mark every result "
                          "measured from it 'tuned on the GPU'")
    show = verbs.add_parser("show", help="what a bundle holds")
    show.add_argument("file", metavar="FILE")

    sub.add_parser("clock", help="the course clock: what each notebook compiles and runs on a "
                   "GPU, and the estimated wait (docs/workshop.md: the course clock)")


def _warm(args: argparse.Namespace, argv) -> int:
    if args.load:
        if args.out:
            raise UsageError("--load and --out go separately: --out writes a file here, --load "
                             "reads one into this machine's cache")
        if args.sha256 is None:
            print("fastdiff: no --sha256 given: loading a file you trust (it holds code that "
                  "runs); pass the SHA-256 that `warm --out` printed to check it first")
        # FastdiffError (another file, other versions, GPU) before anything is unpickled
        header = load_artifacts(args.load, sha256=args.sha256)
        print(f"fastdiff: loaded {header['loaded']} from {args.load} ({header.get('model')}, "
              f"{', '.join(header.get('steps', []))}) into {use_course_cache(verbose=False)}")
        return 0
    if args.out:
        check_artifacts_path("out", args.out)
    if args.sha256:
        raise UsageError("--sha256 checks a file given to --load; `warm --out` prints the one "
                         "to pass on")
    bundle = None
    if not args.no_tuning:
        output_folder("tuning_root", args.tuning_root)
        bundle = bundle_path(args.model, args.device, root=args.tuning_root)
        import_matching(args.tuning_root)  # the cache folder is chosen; nothing compiled yet
    warm_ladder(args.model, weights=args.weights, ladder=args.ladder, steps=args.steps,
                height=args.height, width=args.width, device=args.device, out=args.out,
                steps_filter=args.only, part=args.part, bundle=bundle)
    return 0


def _tuning(args: argparse.Namespace, argv) -> int:
    if args.verb == "export":
        export_tuning(args.out, model=args.model, cache_dir=args.cache_dir)
    elif args.verb == "import":
        if bool(args.files) == bool(args.matching):
            raise UsageError("give the bundle FILE(s) to import, or --matching DIR")
        if args.matching:
            done = import_matching(checks.existing("matching", args.matching,
                                                   "a folder such as results", folder=True),
                                   cache_dir=args.cache_dir)
            print(f"fastdiff: {len(done)} bundle(s) or raw tarball(s) of this machine under "
                  f"{args.matching}")
            return 0
        if args.sha256 and len(args.files) > 1:
            raise UsageError("--sha256 checks one file: import the files one at a time")
        for file in args.files:
            if str(file).endswith(".cache-raw.tgz"):
                if args.from_kind is None:
                    raise UsageError(f"{file} is a raw tarball: import_matching takes this "
                                     "GPU's (--matching DIR); --from-kind KIND takes another "
                                     "kind's")
                import_raw(file, cache_dir=args.cache_dir, from_kind=args.from_kind)
            else:
                import_tuning(file, sha256=args.sha256, cache_dir=args.cache_dir,
                              from_kind=args.from_kind)
    else:
        print(show_tuning(Path(args.file)))
    return 0


def _clock(args: argparse.Namespace, argv) -> int:
    print(clock.course_table())
    return 0


COMPILE_COMMANDS = {"warm": _warm, "tuning": _tuning, "clock": _clock}
