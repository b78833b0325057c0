from hetspec.workers.common.process import exit_now
from hetspec.workers.draft.worker import main

exit_now(main())
