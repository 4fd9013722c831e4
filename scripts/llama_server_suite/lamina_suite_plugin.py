"""pytest plugin: runs llama.cpp's server tests (tools/server/tests) against `lamina serve`.

Loaded by scripts/llama_server_suite/run.sh with `-p lamina_suite_plugin`. It changes nothing in the
suite's files: it maps the suite's Hugging Face models to local GGUF files, turns the suite's one-time
download step into a no-op, and skips (with the reason) a test whose model has no local stand-in.
"""
import os
import sys

import pytest

TESTS_DIR = os.environ["LLAMA_SUITE_TESTS_DIR"]
REPO_ROOT = os.environ["LAMINA_REPO_ROOT"]
SHARED_MODELS = os.path.join(REPO_ROOT, "..", "shared", "models")
SHIPPED = os.path.join(REPO_ROOT, "models")

sys.path.insert(0, TESTS_DIR)
import utils  # noqa: E402  (the suite's own helper module, imported once for every test file)

# (hf repo, hf file) -> local file. The shipped counter model and its draft stand in for the
# suite's speculative pair (stories15M MoE + stories15M q4_0): the tests compare outputs with and
# without a draft, which any exact target/draft pair exercises.
MODEL_MAP = {
    ("ggml-org/test-model-stories260K", None): os.path.join(SHARED_MODELS, "stories260K.gguf"),
    ("ggml-org/models", "tinyllamas/stories260K.gguf"): os.path.join(SHARED_MODELS, "stories260K.gguf"),
    ("ggml-org/stories15M_MOE", "stories15M_MOE-F16.gguf"): os.path.join(SHIPPED, "lamina-counter.gguf"),
}
DOWNLOAD_MAP = {
    "stories15M-q4_0.gguf": os.path.join(SHIPPED, "lamina-counter-draft.gguf"),
}

# Tests whose assertions hold only for the suite's own model (its tokenizer or its text), so a
# stand-in cannot run them: reported as skipped with the reason, never as passed.
NEEDS_SUITE_MODEL = {
    "test_slot_ctx_not_exceeded": "needs stories15M's 32,000-token vocabulary ('Hello ' * 248 is "
                                  "249 tokens there, 993 for the stand-in: over the 256-cell slot)",
    "test_with_ctx_shift": "needs stories15M's 32,000-token vocabulary (the prompt must fit 256 cells)",
    "test_multi_requests_parallel": "its regex (wise|kind|owl|answer) matches stories15M's text only",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.endswith("test_speculative"):
            reason = NEEDS_SUITE_MODEL.get(item.originalname)
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"stand-in model: {reason}"))


_original_start = utils.ServerProcess.start


def _start(self, *args, **kwargs):
    if self.model_hf_repo is not None:
        key = (self.model_hf_repo, self.model_hf_file)
        local = MODEL_MAP.get(key)
        if local is None or not os.path.exists(local):
            pytest.skip(f"no local stand-in for {key[0]} {key[1] or ''} (the suite downloads it)")
        self.model_file = local
        self.model_hf_repo = None
        self.model_hf_file = None
    self.offline = False  # lamina never downloads; --offline is a llama-server flag for its cache
    return _original_start(self, *args, **kwargs)


def _download_file(url, output_file_path=None):
    name = url.split("/").pop()
    local = DOWNLOAD_MAP.get(name)
    if local is None or not os.path.exists(local):
        pytest.skip(f"no local stand-in for {url}")
    return local


utils.ServerProcess.start = _start
utils.ServerPreset.load_all = staticmethod(lambda: None)
utils.download_file = _download_file
