import sys

from hetspec.scheduler.service import main

sys.exit(main())
