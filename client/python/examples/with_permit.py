"""One piece of work under a permit, from Python (the README's example):

    cargo run --release -p permitd -- up --config cluster.toml &
    pip install ./client/python && python client/python/examples/with_permit.py

Endpoints default to cluster.toml's three nodes (``PERMITD_ENDPOINTS`` overrides);
the token is cluster.toml's admin token (``PERMITD_TOKEN`` overrides): it
configures the key, which takes an admin.
"""

import os

from permitd import SemaphoreClient

client = SemaphoreClient(token=os.environ.get("PERMITD_TOKEN", "change-me-local-admin-token"))
client.set_key_config("acct-42", {"limit": 2})

# A context manager: acquired on entry, released on exit (exceptions included).
with client.permit("acct-42", "nightly-report", timeout=30) as permit:
    print(f"holding {permit.count} permit of acct-42, fence {permit.fence}")
    print("usage while held:", client.usage("acct-42"))


# A decorator: every call runs under 2 permits, its fence passed in.
@client.with_permit("acct-42", "nightly-report", count=2, fence_arg="fence")
def nightly_report(fence: int = 0) -> int:
    print(f"running under fence {fence} with 2 permits")
    return 1234


print(f"report done: {nightly_report()} rows")
print("usage after:", client.usage("acct-42"))
