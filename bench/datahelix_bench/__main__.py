"""`python3 -m datahelix_bench ARGS`: what `datahelix bench ARGS` runs."""
import sys

from .cli import main
from .common import CMD

try:
    sys.exit(main())
except KeyboardInterrupt:
    print(f"datahelix: {CMD}: interrupted", file=sys.stderr)
    sys.exit(130)
