"""A generated module is handed out only once its code has run: on a first launch from two
threads at once, the second took it half run (a bare AttributeError: no kernel function yet)."""

import threading
import time
import uuid

from tapegrad.backends.cache import load_source


def test_a_module_another_thread_is_running_is_not_handed_out_half_run(monkeypatch, tmp_path):
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path))     # (its files: not the cache's)
    source = f"# {uuid.uuid4()}\nimport time\ntime.sleep(0.3)\nDONE = True\n"
    first: list = []
    runner = threading.Thread(target=lambda: first.append(load_source(source, "half_run")[0]))
    runner.start()
    time.sleep(0.1)                       # (the other thread is inside the module's code)
    module, _ = load_source(source, "half_run")
    assert module.DONE
    runner.join()
    assert first == [module]


def test_a_module_may_load_another_while_it_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path))
    inner = f"# {uuid.uuid4()}\nVALUE = 41\n"
    outer = (f"# {uuid.uuid4()}\nfrom tapegrad.backends.cache import load_source\n"
             f"VALUE = load_source({inner!r}, 'inner')[0].VALUE + 1\n")
    assert load_source(outer, "outer")[0].VALUE == 42
