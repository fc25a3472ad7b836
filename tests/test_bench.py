"""The bench's timing: implementations compared in one row run in turns."""

from tapegrad.bench import _side_by_side_ms


def test_implementations_run_in_turns_and_a_failing_one_is_dropped():
    calls = []

    def make(name):
        return lambda: calls.append(name)

    def broken():
        calls.append("broken")
        raise RuntimeError("no such device\nmore")

    failed = {}
    ms = _side_by_side_ms({"a": make("a"), "b": make("b"), "c": broken}, 6, failed)
    assert set(ms) == {"a", "b"} and all(v >= 0 for v in ms.values())
    assert failed == {"c": "RuntimeError: no such device"}
    assert calls.count("broken") == 1          # not retried after it failed
    # three rounds of one untimed and two timed calls each, the order rotating
    assert calls.count("a") == calls.count("b") == 9
    firsts = [calls[k] for k in range(len(calls)) if k == 0 or calls[k - 1] != calls[k]]
    assert firsts[:5] == ["a", "b", "broken", "b", "a"]
