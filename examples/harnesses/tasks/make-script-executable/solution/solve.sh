#!/bin/bash
# Reference solution (run in the working directory).
set -euo pipefail
printf '#!/bin/sh\necho ok\n' > run.sh && chmod +x run.sh
