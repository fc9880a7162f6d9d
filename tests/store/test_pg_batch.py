"""The PostgreSQL store's statement batcher, on its own (the store's tests use it for real)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from payonce.errors import StorageError
from payonce.store.postgres.batch import MAX_BYTES, StatementBatcher

Item = tuple[str, str, int]  # tenant, key, size


def _record(item: Item) -> tuple[str, str]:
    return item[0], item[1]


class Recorder:
    """Stands in for the statement: records each batch, answers the sizes."""

    def __init__(self, fail: list[BaseException] | None = None) -> None:
        self.batches: list[list[Item]] = []
        self.fail = fail or []

    async def run(self, items: Sequence[Item]) -> list[int]:
        self.batches.append(list(items))
        await asyncio.sleep(0.01)  # a round trip: the next items queue meanwhile
        if self.fail:
            raise self.fail.pop(0)
        return [size for _, _, size in items]


async def test_items_that_arrive_while_a_statement_runs_go_together_sorted() -> None:
    recorder = Recorder()
    batcher = StatementBatcher(recorder.run, record=_record)
    first = asyncio.create_task(batcher.submit(("t", "a", 1)))
    await asyncio.sleep(0.001)
    rest = [batcher.submit(("t", key, 2)) for key in "zyx"]
    assert await asyncio.gather(first, *rest) == [1, 2, 2, 2]
    assert recorder.batches == [[("t", "a", 1)], [("t", "x", 2), ("t", "y", 2), ("t", "z", 2)]]
    assert (batcher.statements, batcher.items) == (2, 4)


async def test_one_record_twice_never_shares_a_statement() -> None:
    recorder = Recorder()
    batcher = StatementBatcher(recorder.run, record=_record)
    await asyncio.gather(*(batcher.submit(("t", key, 0)) for key in ("a", "a", "b", "a")))
    for batch in recorder.batches:
        assert len({_record(item) for item in batch}) == len(batch)
    assert [len(batch) for batch in recorder.batches] == [2, 1, 1]


async def test_a_statement_is_bounded_in_bytes() -> None:
    recorder = Recorder()
    batcher = StatementBatcher(recorder.run, record=_record, size=lambda item: item[2])
    big = MAX_BYTES // 2 + 1
    await asyncio.gather(*(batcher.submit(("t", key, big)) for key in "abc"))
    assert [len(batch) for batch in recorder.batches] == [1, 1, 1]


async def test_an_error_reaches_every_caller_of_its_statement_and_the_next_goes_on() -> None:
    recorder = Recorder(fail=[StorageError("down")])
    batcher = StatementBatcher(recorder.run, record=_record)
    results = await asyncio.gather(
        *(batcher.submit(("t", key, 0)) for key in "ab"), return_exceptions=True
    )
    assert [type(result) for result in results] == [StorageError, StorageError]
    assert await batcher.submit(("t", "c", 3)) == 3


async def test_a_deadlock_victim_is_sent_again() -> None:
    recorder = Recorder(fail=[StorageError("deadlock detected")])
    batcher = StatementBatcher(
        recorder.run, record=_record, retry_if=lambda exc: "deadlock" in str(exc)
    )
    assert await batcher.submit(("t", "a", 5)) == 5
    assert len(recorder.batches) == 2


async def test_a_result_whose_caller_left_goes_to_orphaned() -> None:
    recorder = Recorder()
    left: list[tuple[Item, int]] = []
    batcher = StatementBatcher(
        recorder.run, record=_record, orphaned=lambda item, result: left.append((item, result))
    )
    task = asyncio.create_task(batcher.submit(("t", "a", 7)))
    await asyncio.sleep(0.001)  # sent
    task.cancel()
    await asyncio.sleep(0.05)
    assert left == [(("t", "a", 7), 7)]
    # cancelled before it was sent: never sent
    late = asyncio.create_task(batcher.submit(("t", "b", 1)))
    blocker = asyncio.create_task(batcher.submit(("t", "c", 1)))
    await asyncio.sleep(0)
    late.cancel()
    await blocker
    assert all(item[1] != "b" for batch in recorder.batches for item in batch) or any(
        item[1] == "b" for item, _ in left
    )


async def test_close_cancels_the_waiting_callers() -> None:
    recorder = Recorder()
    batcher = StatementBatcher(recorder.run, record=_record)
    tasks = [asyncio.create_task(batcher.submit(("t", key, 0))) for key in "ab"]
    await asyncio.sleep(0)
    await batcher.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.gather(*tasks)
