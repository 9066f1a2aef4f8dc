from airlock_redis.cli import main

raise SystemExit(main())
