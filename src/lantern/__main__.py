import sys

from lantern.pipeline.cli import main

sys.exit(main())
