"""An asyncio worker pool: 12 jobs over 3 accounts, each under a permit of its
account's key (limit 2), at most 6 running in this process.

    python client/python/examples/asyncio_pool.py   (PERMITD_ENDPOINTS, PERMITD_TOKEN as with_permit.py)
"""

import asyncio
import os

from permitd import AsyncSemaphoreClient
from permitd.integrations import AsyncWorkerPool


async def export(account: int, part: int) -> str:
    await asyncio.sleep(0.05)  # the job's real work
    return f"acct-{account} part {part}"


async def main() -> None:
    async with AsyncSemaphoreClient(token=os.environ.get("PERMITD_TOKEN", "change-me-local-admin-token")) as client:
        for account in range(3):
            await client.set_key_config(f"acct-{account}", {"limit": 2})
        async with AsyncWorkerPool(client, workers=6) as pool:
            jobs = [pool.submit(f"acct-{account}", "export", export, account, part) for account in range(3) for part in range(4)]
            for done in await asyncio.gather(*jobs):
                print("exported", done)


if __name__ == "__main__":
    asyncio.run(main())
