"""`python -m castore.lab.service`: run the fake service (start_service spawns exactly this)."""

from castore.lab.service.serve import main

raise SystemExit(main())
