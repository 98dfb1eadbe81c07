import sys

from grader.export.cli import main

sys.exit(main())
