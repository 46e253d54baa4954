"""LLMProposer through real litellm against a real OpenAI-compatible HTTP server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from fake_llm_server import Reply, fake_llm  # noqa: F401  (fixture)
from kforge_tui.errors import UsageError
from kforge_tui.search import prompts
from kforge_tui.search.proposers.base import NodeView, ProposalContext
from kforge_tui.search.proposers.llm import LLMProposer, check_llm_settings
from kforge_tui.regions.task import Task

KERNEL = """#include "kforge_region.h"
__global__ void k(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, cudaStream_t stream) {
  k<<<(KF_IN0_NUMEL + 255) / 256, 256, 0, stream>>>((const float*)inputs[0], (float*)outputs[0],
                                                    KF_IN0_NUMEL);
  return (int)cudaGetLastError();
}
"""
BROKEN = KERNEL.replace("y[i] = x[i]", "y[i] = undefined_thing + x[i]")


def _task() -> Task:
    import dataclasses

    import torch

    from kforge_tui.regions.build import task_of

    t = task_of(lambda x: torch.relu(x), (torch.randn(64, 1024),), backend="cuda")
    return dataclasses.replace(t, calls=3)


def _ctx(mode="root", parent_source=None, siblings=(), error_log="", status="ok") -> ProposalContext:
    t = _task()
    root = NodeView(1, None, "root", None, status="ok", speedup=1.0)
    parent = root if parent_source is None else NodeView(
        7, 1, "llm:root", parent_source, status=status, message="compile error at line 4",
        time_us=12.5 if status == "ok" else None, speedup=1.6 if status == "ok" else None,
        resources={"registers": 18, "spill_stores": 0}, error_log=error_log)
    return ProposalContext(
        task=t.to_json(), signature=t.signature().declaration(),
        canonical=t.header(), reference=t.code(),
        device={"backend": "cuda", "name": "NVIDIA H200", "arch": "sm_90", "sms": 132,
                "compute_capability": "9.0", "bandwidth_gbs": 4250.0, "l2_bytes": 60 * 2**20},
        eager_us=20.0, compiled_us=11.0, floor_us=3.1, parent=parent,
        ancestors=[] if parent is root else [root], siblings=list(siblings), tried=[], mode=mode)


def _proposer(srv, **kw) -> LLMProposer:
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 10)
    return LLMProposer("openai/fake-coder", api_base=srv.url, **kw)


# ----------------------------------------------------------------- good and bad answers

async def test_good_kernel(fake_llm):
    fake_llm.push(Reply(content=f"Vectorised grid-stride relu.\n\n```cuda\n{KERNEL}```\n",
                        prompt_tokens=1234, completion_tokens=321))
    p = _proposer(fake_llm)
    prop = await p.propose(_ctx())
    assert prop.error is None
    assert prop.source == KERNEL
    assert prop.action == "llm:root" and prop.proposer == "openai/fake-coder"
    assert (prop.prompt_tokens, prop.completion_tokens) == (1234, 321)
    assert prop.cost_usd == 0.0  # unknown local model: no price, no exception
    assert fake_llm.count == 1
    assert "kforge_launch" in prop.prompt and prop.response.startswith("Vectorised")
    body = fake_llm.requests[0]
    assert body["model"] == "fake-coder" and body["messages"][0]["role"] == "system"
    assert p.totals()["prompt_tokens"] == 1234 and p.totals()["failures"] == 0


async def test_kernel_with_compile_error_is_still_a_source(fake_llm):
    """Compilation is the sandbox's job: the proposer returns whatever code the model wrote."""
    fake_llm.push(Reply(content=f"```c++\n{BROKEN}```"))
    prop = await _proposer(fake_llm).propose(_ctx())
    assert prop.error is None and "undefined_thing" in prop.source


async def test_prose_without_code(fake_llm):
    fake_llm.push(Reply(content="I think you should use shared memory and warp shuffles."))
    p = _proposer(fake_llm)
    prop = await p.propose(_ctx())
    assert prop.source is None and prop.error == "no code in the answer (prose only)"
    assert prop.response.startswith("I think")
    assert p.failures == 1 and fake_llm.count == 1  # a bad answer is not retried


async def test_truncated_answer(fake_llm):
    fake_llm.push(Reply(content="```cuda\n" + KERNEL[:200], finish_reason="length"))
    prop = await _proposer(fake_llm).propose(_ctx())
    assert prop.source is None
    assert prop.error.startswith("truncated answer") and "finish_reason=length" in prop.error
    assert "\n" not in prop.error


async def test_429_then_success_respects_retry_after(fake_llm):
    fake_llm.push(Reply(status=429, retry_after=0.4), Reply(status=429),
                  Reply(content=f"```cuda\n{KERNEL}```"))
    p = _proposer(fake_llm, max_retries=3)
    prop = await p.propose(_ctx())
    assert prop.source == KERNEL and prop.error is None
    assert fake_llm.count == 3 and p.attempts == 3
    gap = fake_llm.request_times[1] - fake_llm.request_times[0]
    assert gap >= 0.38, f"Retry-After 0.4 s not respected (retried after {gap:.3f} s)"


async def test_http_500_after_retries(fake_llm):
    fake_llm.default = Reply(status=500, error_message="upstream exploded")
    p = _proposer(fake_llm, max_retries=2)
    prop = await p.propose(_ctx())
    assert prop.source is None
    assert fake_llm.count == 3  # 1 attempt + 2 retries, no more (litellm's own retries are off)
    assert "500" in prop.error and "after 3 attempts" in prop.error and "\n" not in prop.error
    assert p.totals()["failures"] == 1 and p.totals()["attempts"] == 3


async def test_client_error_is_not_retried(fake_llm):
    fake_llm.push(Reply(status=401, error_message="bad key"))
    prop = await _proposer(fake_llm, max_retries=3).propose(_ctx())
    assert prop.source is None and "401" in prop.error and fake_llm.count == 1


async def test_slow_answer_times_out(fake_llm):
    fake_llm.default = Reply(content=f"```cuda\n{KERNEL}```", delay_s=5)
    p = _proposer(fake_llm, timeout_s=0.5, max_retries=1)
    t0 = time.monotonic()
    prop = await p.propose(_ctx())
    took = time.monotonic() - t0
    assert prop.source is None and prop.error.startswith("timed out after 0.5 s")
    assert fake_llm.count == 2 and took < 4.0


async def test_streaming(fake_llm):
    fake_llm.push(Reply(content=f"Here it is:\n```cuda\n{KERNEL}```\nDone.", stream_chunk_chars=7,
                        prompt_tokens=900, completion_tokens=150))
    p = _proposer(fake_llm, stream=True)
    prop = await p.propose(_ctx())
    assert fake_llm.requests[0]["stream"] is True
    assert prop.source == KERNEL and prop.error is None
    assert (prop.prompt_tokens, prop.completion_tokens) == (900, 150)


async def test_streaming_truncated(fake_llm):
    fake_llm.push(Reply(content="```cuda\n" + KERNEL[:300], finish_reason="length"))
    prop = await _proposer(fake_llm, stream=True).propose(_ctx())
    assert prop.source is None and prop.error.startswith("truncated answer")


async def test_connection_refused_is_a_failed_proposal():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = LLMProposer("openai/x", api_base=f"http://127.0.0.1:{port}/v1", max_retries=1,
                    backoff_s=0.01, timeout_s=5)
    prop = await p.propose(_ctx())
    assert prop.source is None and prop.error and "\n" not in prop.error


async def test_concurrency_limit(fake_llm):
    fake_llm.default = Reply(content=f"```cuda\n{KERNEL}```", delay_s=0.3)
    p = _proposer(fake_llm, concurrency=2)
    t0 = time.monotonic()
    props = await asyncio.gather(*(p.propose(_ctx()) for _ in range(4)))
    took = time.monotonic() - t0
    assert all(x.source == KERNEL for x in props)
    # 4 calls of 0.3 s, 2 at a time: two waves; starts come in pairs
    starts = sorted(t - fake_llm.request_times[0] for t in fake_llm.request_times)
    assert starts[2] >= 0.28 and took >= 0.58


# ----------------------------------------------------------------- prompts carry the facts

async def test_repair_prompt_carries_error_and_siblings(fake_llm):
    fake_llm.push(Reply(content=f"```cuda\n{KERNEL}```"))
    sib = NodeView(9, 7, "llm:repair", "int x;", status="compile_error",
                   message="expected ';' at line 3")
    ctx = _ctx("repair", parent_source=BROKEN, siblings=[sib], status="compile_error",
               error_log="kernel.cu(4): error: identifier \"undefined_thing\" is undefined")
    prop = await _proposer(fake_llm).propose(ctx)
    assert prop.action == "llm:repair" and prop.source == KERNEL
    user = fake_llm.prompts()[0]
    for needle in ('identifier "undefined_thing" is undefined', "undefined_thing + x[i]",
                   "#9 llm:repair: compile_error - expected ';' at line 3",
                   "FAILED: compile_error"):
        assert needle in user, needle


def test_improve_prompt_contents():
    ctx = _ctx("improve", parent_source=KERNEL)
    user = prompts.build_messages(ctx)[1]["content"]
    for needle in ['extern "C" int kforge_launch(const void* const* inputs, void* const* outputs, '
                   "cudaStream_t stream)",
                   "torch.ops.aten.relu.default(in0)", "The PyTorch reference",
                   "inputs[0]: shape [64, 1024] dtype float32 stride [1024, 1]",
                   "#define KF_IN0_NUMEL 65536LL", '#include "kforge_region.h"',
                   "NVIDIA H200", "132 SMs", "compute capability 9.0",
                   "4250 GB/s", "PyTorch eager: 20.00 us", "torch.compile: 11.00 us",
                   "FLOPs / peak for matrix work): 3.10 us", "measured 12.50 us = 1.60x eager",
                   "registers=18", "spill_stores=0", "cudaMallocAsync", "No static or global",
                   "no stream, event or graph creation", "torch", "exactly one fenced ```cuda"]:
        assert needle in user, needle
    assert KERNEL.strip() in user


def test_cpu_prompt_rules():
    ctx = _ctx()
    ctx.task["backend"] = "cpu"
    ctx.device = {"backend": "cpu", "name": "Xeon", "sms": 2}
    user = prompts.build_messages(ctx)[1]["content"]
    assert "uint16_t raw bits" in user and "```cpp" in user and "cudaMallocAsync" not in user


# ----------------------------------------------------------------- extraction

@pytest.mark.parametrize("fence", ["```cuda", "```cpp", "```c++", "```", "~~~cuda", "````cu"])
def test_extract_fences(fence):
    close = fence[:len(fence) - len(fence.lstrip(fence[0]))]
    text = f"Idea.\n{fence}\n{KERNEL}{close}\nThat's it."
    assert prompts.extract_code(text) == (KERNEL, None)


def test_extract_picks_block_defining_entry():
    text = f"```cuda\n__device__ float helper();\n```\nfull file:\n```cuda\n{KERNEL}```\n```bash\nnvcc x.cu\n```"
    assert prompts.extract_code(text)[0] == KERNEL


def test_extract_failures():
    assert prompts.extract_code("")[1] == "empty answer"
    assert prompts.extract_code("```cuda\nint x;\n```")[1].startswith("no code block defines")
    assert prompts.extract_code("```cuda\n" + KERNEL)[1].startswith("truncated answer")
    assert prompts.extract_code(KERNEL) == (KERNEL, None)  # a bare source file is fine


# ----------------------------------------------------------------- can_expand, settings

def test_can_expand_caps_children():
    p = LLMProposer("openai/x", max_children=2)
    sib = NodeView(2, 1, "llm:root", "x")
    assert p.can_expand(_ctx(siblings=[sib]))
    assert not p.can_expand(_ctx(siblings=[sib, sib]))


def test_check_settings_ok_with_local_server(fake_llm):
    check_llm_settings("openai/fake-coder", fake_llm.url)
    check_llm_settings("hosted_vllm/whatever", fake_llm.url)


def test_check_settings_unknown_provider():
    with pytest.raises(UsageError, match="unknown LLM provider in 'nosuchprovider/x'") as e:
        check_llm_settings("nosuchprovider/x")
    assert "\n" not in str(e.value)


def test_check_settings_missing_key(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(UsageError, match="ANTHROPIC_API_KEY"):
        check_llm_settings("anthropic/claude-sonnet-4-5")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    check_llm_settings("anthropic/claude-sonnet-4-5")  # no network needed: key present
    monkeypatch.delenv("MY_KEY_VAR", raising=False)
    with pytest.raises(UsageError, match="MY_KEY_VAR is not set"):
        check_llm_settings("openai/gpt-4o", api_key_env="MY_KEY_VAR")


def test_check_settings_hosted_vllm_needs_base(monkeypatch):
    monkeypatch.delenv("HOSTED_VLLM_API_BASE", raising=False)
    with pytest.raises(UsageError, match="needs --api-base"):
        check_llm_settings("hosted_vllm/qwen")


def test_check_settings_unreachable_api_base():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(UsageError, match=f"--api-base http://127.0.0.1:{port}/v1 is unreachable"):
        check_llm_settings("openai/x", f"http://127.0.0.1:{port}/v1", connect_timeout_s=1)
    assert time.monotonic() - t0 < 3
    with pytest.raises(UsageError, match="is not a URL"):
        check_llm_settings("openai/x", "not a url")


def test_import_is_lazy():
    """`kforge --help` must not pay for importing litellm."""
    import subprocess
    import sys

    code = ("import sys, kforge_tui.search.proposers.llm, kforge_tui.search.prompts;"
            "print('litellm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ}, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------- a real model's conv region

@pytest.mark.slow
@pytest.mark.models
def test_prompt_for_a_resnet_conv_region_carries_its_graph_code_and_shapes(fake_llm, tmp_path):
    """`kforge optimize sample_models/resnet50.py --ops conv` through the real CLI, with the
    scripted OpenAI-compatible server on 127.0.0.1 as the LLM: the prompt shows the conv region's
    own GraphModule code as the reference, with its real shapes and strides and the ABI header."""
    import json
    import subprocess
    import sys

    fake_llm.default = Reply(content="I would tile the convolution as an implicit GEMM.")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-m", "kforge_tui", "optimize", "sample_models/resnet50.py",
                        "--device", "cpu", "--headless", "--ops", "conv", "--top", "1", "--budget", "1",
                        "--parallel", "1", "--llm", "openai/fake-coder", "--api-base", fake_llm.url,
                        "--no-apply", "--run-dir", str(tmp_path / "run")],
                       capture_output=True, text=True, cwd=root, timeout=900,
                       env=dict(os.environ, OPENAI_API_KEY="sk-test", KFORGE_SAMPLE_SIZE="ci"))
    assert fake_llm.count >= 1, p.stderr[-3000:]
    user = fake_llm.prompts()[0]
    assert "torch.ops.aten.convolution.default(in" in user  # the region's own graph
    assert "def forward(self, in0, in1" in user
    shown = subprocess.run([sys.executable, "-m", "kforge_tui", "show", str(tmp_path / "run"), "--json"],
                           capture_output=True, text=True, cwd=root, timeout=120)
    (task,) = json.loads(shown.stdout)["tasks"]
    assert task["op"] == "conv"
    for m in task.get("task", {}).get("inputs", []) or []:
        assert f"shape {m['shape']} dtype {m['dtype']} stride {m['stride']}" in user
    assert "#define KF_IN0_SIZE_0" in user and "modeling_resnet.py:" in user
