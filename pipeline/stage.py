"""What every DVC stage script shares: its command line and its params section."""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.params import load_section


def stage_params(name: str, argv: list[str] | None = None) -> Any:
    """Parse ``--params FILE`` (default params.yaml) and return the validated section ``name``."""
    parser = argparse.ArgumentParser(prog=f"python -m stages.{name}", description=f"DVC stage '{name}'.")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    return load_section(name, args.params)
