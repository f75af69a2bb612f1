"""How a writer with several connections picks the jobs of its next batch
(store/writer_lines.py): in submission order, never a job whose key a batch in
flight holds, never a job past an earlier one on the same key; and the cost of
a take does not grow with the jobs that wait behind a held key. Pure: no
database, no event loop."""

from __future__ import annotations

from typing import Any

from fencepost.store.batch import Job, Key
from fencepost.store.writer_lines import MAX_LINES_BATCH, JobLines

A, B, C = Key("lock", "p", "a"), Key("lock", "p", "b"), Key("lock", "p", "c")


def job(name: str, *keys: Key) -> Job[Any]:
    made: Job[Any] = Job(fn=lambda tx: name, future=None, loop=None, keys=keys)  # type: ignore[arg-type]
    made.origin = name  # names the job in assertions
    return made


def names(taken: tuple[list[Job[Any]], set[Key]] | None) -> list[str]:
    assert taken is not None
    return [j.origin for j in taken[0]]


def test_with_nothing_in_flight_a_batch_takes_everything_in_order():
    jobs = JobLines()
    for made in [job("a1", A), job("b1", B), job("a2", A), job("none")]:
        jobs.put(made)
    assert names(jobs.take()) == ["a1", "b1", "a2", "none"]
    assert jobs.count() == 0


def test_a_held_key_passes_its_jobs_over_and_keeps_their_order():
    jobs = JobLines()
    jobs.put(job("a1", A))
    first = jobs.take()
    assert names(first) == ["a1"]  # in flight, holding A
    for made in [job("a2", A), job("b1", B), job("ab", A, B), job("b2", B), job("c1", C)]:
        jobs.put(made)
    # a2 waits for A; "ab" touches A, so b2 must not pass it on B.
    assert names(jobs.take()) == ["b1", "c1"]
    jobs.done({B, C})
    assert jobs.count() == 3
    jobs.done({A})
    assert names(jobs.take()) == ["a2", "ab", "b2"]


def test_a_full_batch_leaves_the_rest_of_its_keys_to_wait_for_it():
    jobs = JobLines()
    for i in range(MAX_LINES_BATCH + 2):
        jobs.put(job(f"a{i}", A))
    jobs.put(job("b", B))
    batch = jobs.take()
    assert names(batch)[:2] == ["a0", "a1"] and len(names(batch)) == MAX_LINES_BATCH
    # The two left on A wait for the batch that holds A; B's job goes on.
    assert names(jobs.take()) == ["b"]
    jobs.done({B})
    assert jobs.count() == 2
    assert batch is not None
    jobs.done(batch[1])
    assert names(jobs.take()) == [f"a{MAX_LINES_BATCH}", f"a{MAX_LINES_BATCH + 1}"]


class CountedKey(Key):
    """A key that counts how often the writer's lines look it up."""

    looked = 0

    def __hash__(self) -> int:
        CountedKey.looked += 1
        return super().__hash__()


def test_a_take_does_not_look_at_every_job_waiting_behind_a_held_key():
    held, other = CountedKey(*A), CountedKey(*B)
    jobs = JobLines()
    jobs.put(job("a0", held))
    assert names(jobs.take()) == ["a0"]  # holds A
    for i in range(10_000):
        jobs.put(job(f"a{i + 1}", held))
    jobs.put(job("b", other))
    CountedKey.looked = 0
    assert names(jobs.take()) == ["b"]
    assert CountedKey.looked < 20, f"keys looked up {CountedKey.looked} times for a take of one"


def test_a_job_marked_ahead_goes_before_the_jobs_waiting_on_its_keys():
    jobs = JobLines()
    jobs.put(job("a1", A))
    assert names(jobs.take()) == ["a1"]  # in flight, holding A
    for made in [job("a2", A), job("b1", B), job("ab", A, B), job("c1", C)]:
        jobs.put(made)
    upkeep = job("keep", A, B)
    upkeep.ahead = True
    jobs.put(upkeep)
    # It waits for the batch holding A like anything on A, but then goes
    # first, before a2 and ab on A and before b1 on B, which it displaced.
    assert names(jobs.take()) == ["c1"]
    jobs.done({C})
    jobs.done({A})
    assert names(jobs.take()) == ["keep", "a2", "b1", "ab"]
    assert jobs.count() == 0


def test_a_job_marked_ahead_on_free_keys_is_taken_first():
    jobs = JobLines()
    for made in [job("a1", A), job("b1", B)]:
        jobs.put(made)
    upkeep = job("keep", B)
    upkeep.ahead = True
    jobs.put(upkeep)
    assert names(jobs.take()) == ["keep", "a1", "b1"]
