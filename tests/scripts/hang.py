"""Worker for tests/test_launcher.py: prints one line, then never finishes (the launcher's timeout must stop it)."""
import time

print("started, now sleeping", flush=True)
time.sleep(600)
