from hetspec.workers.common.process import exit_now
from hetspec.workers.target.worker import main

exit_now(main())
