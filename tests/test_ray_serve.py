"""One replica of a whole engine on Ray Serve, for real: a local Ray instance
started by hetspec-ray, requests through the openai client, clean shutdown."""
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import psutil
import pytest

from helpers import orphaned_segments

pytest.importorskip("ray.serve", reason="Ray Serve is the optional extra: pip install 'hetspec[ray]'")

KEY = "ray-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_replica_serves_the_openai_api_and_shuts_down_clean(tmp_path):
    toml = tmp_path / "tiny.toml"
    toml.write_text('[draft]\nbackend = "torch"\nmodel = "random:seed=1"\n\n[target]\nmodel = "random:seed=0"\n\n'
                    '[replicas]\nnum = 1\ncpus = 1\n')
    port = _free_port()
    env = {**os.environ, "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}
    process = subprocess.Popen([sys.executable, "-m", "hetspec.http.ray_serve", str(toml), "--http",
                                f"127.0.0.1:{port}", "--api-key", KEY], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "the Ray Serve application did not come up"
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        whole = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0)
        assert whole.usage.completion_tokens == 6 and whole.model_extra["hetspec"]["new_tokens"] == 6
        streamed = client.completions.create(model="tiny", prompt="abc", max_tokens=6, temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    finally:
        group = psutil.Process(process.pid).children(recursive=True) if process.poll() is None else []
        process.send_signal(signal.SIGINT)
        process.wait(120)
    assert process.returncode == 0
    _, alive = psutil.wait_procs(group, timeout=30)
    if alive:                                    # clean up for the next test, then fail
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), "stop", "--force"],
                       capture_output=True, timeout=120, env=env, check=False)
    assert [p.pid for p in alive] == []
    assert not orphaned_segments()
