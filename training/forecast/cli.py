"""`veil train forecast`: fit a linear forecaster (OLS, RRR, DWRR or Root Purge) on a CSV file or a bundled series.

Examples:
    veil train forecast --data ETTh1.csv --lookback 336 --horizon 96 --fit rrr --split 0.6 0.2 0.2 --out runs/etth1-rrr
    veil train forecast --data bundled:co2 --lookback 104 --horizon 52 --fit rootpurge --rp-lambda 0.5 --out runs/co2
    veil train forecast --data file.csv --lookback 96 --horizon 24 --fit dwrr --rank 8 --roots-png roots.png

The CSV holds a date column and one numeric column per channel. Metrics (JSON) go to stdout, the progress
bar to stderr. Only the argument parser is built at import time; numpy, torch and the fits load in main().
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import ForecastDataConfig, ForecastFitConfig, ForecastModelConfig

EXAMPLE = """example:
  veil train forecast --data ETTh1.csv --lookback 336 --horizon 96 --fit rrr --split 0.6 0.2 0.2 --out runs/etth1
  veil train forecast --data bundled:co2 --lookback 104 --horizon 52 --fit rootpurge --out runs/co2-rp
"""


def build_parser(prog: str = "veil train forecast") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], epilog=EXAMPLE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True,
                        help="a CSV file (date column + channels) or bundled:NAME (co2, elnino, sunspots, macrodata)")
    parser.add_argument("--date-column", default=None, help="the CSV's date column (default: found by name, or the first)")
    parser.add_argument("--columns", nargs="+", default=None, help="channels to use (default: every other column)")
    parser.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: runs/forecast-<fit>)")
    parser.add_argument("--roots-png", type=Path, default=None, help="also plot the characteristic roots here")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--max-memory-gb", type=float, default=None,
                        help="refuse a fit estimated to need more memory than this, before building any array "
                             "(default: half the machine's memory)")
    ForecastModelConfig.add_arguments(parser)
    ForecastFitConfig.add_arguments(parser)
    ForecastDataConfig.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .data import load_bundled, load_csv
    from .diagnostics import characteristic_roots, plot_roots
    from .trainer import save_forecaster, train_forecaster

    args = build_parser().parse_args(argv)
    model = ForecastModelConfig.from_args(args)
    fit_config = ForecastFitConfig.from_args(args)
    data = ForecastDataConfig.from_args(args)
    if args.data.startswith("bundled:"):
        series = load_bundled(args.data.partition(":")[2])
    else:
        series = load_csv(args.data, args.date_column, args.columns)
    if args.max_memory_gb is not None and not args.max_memory_gb > 0:
        raise ValueError(f"--max-memory-gb: expected a number of GiB > 0, received {args.max_memory_gb}")
    limit = None if args.max_memory_gb is None else int(args.max_memory_gb * 2**30)
    result = train_forecaster(series, model, fit_config, data, progress=not args.no_progress, max_memory_bytes=limit)
    out = args.out or Path("runs") / f"forecast-{fit_config.fit}"
    save_forecaster(result, out)
    if args.roots_png:
        plot_roots(characteristic_roots(result.forecaster), args.roots_png,
                   title=f"{series.name}: {fit_config.fit}, L={model.lookback}, H={model.horizon}")
    summary = {"checkpoint": str(out), **{k: v for k, v in result.metrics.items() if k != "test_per_horizon"}}
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
