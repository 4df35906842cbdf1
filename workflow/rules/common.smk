# Config validation (before any job starts) and the input functions shared by the rule files.
import sys

from lantern.config import expand_methods, validate_config
from lantern.errors import UserError


def validate(cfg):
    """Validate and fill defaults in place; a bad config stops the run with one line naming the key."""
    try:
        checked = validate_config(cfg)
    except UserError as e:
        sys.exit(f"error: {e}")
    cfg.clear()
    cfg.update(checked)


validate(config)
OUT = config["outdir"]
POINTS = expand_methods(config)
MODES = config["sweep"]["modes"]


wildcard_constraints:
    mode="|".join(MODES),
    point="|".join(sorted(POINTS)) or "none",
    world="default|clean",
    shard=r"\d+",


def all_outputs():
    return rules.toy_data.output
