"""LangGraph's checkpointer conformance suite (the PyPI package
``langgraph-checkpoint-conformance``) against :class:`SessionStoreSaver`: every capability,
base and extended. The report (passed/total) is printed past pytest's capture
(``tests/python.rs`` shows it in CI's log)."""

from __future__ import annotations

import asyncio
import tempfile

from langgraph.checkpoint.conformance import checkpointer_test, validate

from session_store.langgraph import SessionStoreSaver


@checkpointer_test(name="SessionStoreSaver")
async def session_store_saver():
    with tempfile.TemporaryDirectory() as folder:
        saver = SessionStoreSaver(folder)
        try:
            yield saver
        finally:
            saver.close()


def test_conformance_suite_passes_every_test(capsys) -> None:
    report = asyncio.run(validate(session_store_saver))
    results = report.results.values()
    passed = sum(r.tests_passed for r in results)
    failed = sum(r.tests_failed for r in results)
    skipped = [name for name, r in report.results.items() if not r.detected]
    with capsys.disabled():
        report.print_report()
        print(f"langgraph checkpoint conformance: {passed}/{passed + failed}")
    failures = [f for r in results for f in r.failures]
    assert not skipped, f"capabilities not detected: {skipped}"
    assert failed == 0, "\n".join(failures)
    assert passed == 81, f"expected the suite's 81 tests, ran {passed}"
