"""`flashstate fleet`: N `flashstate serve` replicas behind vllm-router, optionally sharing hybrid states
through one Mooncake master (launch.py; the router's command in router.py; the CLI in command.py)."""
