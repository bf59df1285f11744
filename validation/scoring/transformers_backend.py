"""``counterfactory ask --backend transformers --model PATH_OR_ID``: a local vision-language model
(Qwen2-VL / Qwen2.5-VL class) answers the trials through Hugging Face ``transformers``.

The model is the folder ``--model`` names (``save_pretrained``'s, or a Hub snapshot), or a Hub id
already in the local Hugging Face cache; it is loaded once per run (``AutoProcessor`` and
``AutoModelForImageTextToText``), on the first question, on ``device`` (``auto``: the GPU when
torch sees one) in ``dtype`` (``auto``: bfloat16 on a GPU, float32 on the CPU). Questions travel
through the same paid-request client as the ``openai`` backend's
(:class:`~counterfactory.manifests.paid.direct.DirectClient`), so the answers ledger, resume and
the spend cap work as they do there; an answer costs 0 USD. ``--concurrency`` is the batch size:
the questions in flight are answered by one ``generate`` call (left padding), and each answer is
committed as its batch returns.

Decoding. Each question's own settings (the trial bank's ``decoding``): ``max_tokens`` (each
answer cut to its own, the batch generating to the largest; 256 when the bank names none),
``temperature`` 0 (or none) is greedy, above 0 samples (with ``top_p`` when named). A sampled
question draws from its own ``torch.Generator``, seeded from the ``seed`` option and the answer id
(trial, lineage, decoding, sample index: a noise repeat of the same prompt and image draws anew),
so a sampled answer is the same whichever batch it is in and whatever else is sampled beside it.
The model's own ``generation_config`` (repetition penalty, top-k) is not applied: only the bank's
settings, and the model's end-of-turn and padding tokens.

Lineage: the model as given, its revision (the commit of a Hub snapshot folder
``.../snapshots/<commit>``; for another folder ``sha256:`` of its ``config.json`` and its weight
files' names, sizes and first and last MiB, so a re-trained or re-initialised model in the same
folder gets new answer ids without reading gigabytes), the dtype, the image-size limits and the
system prompt: each answer id changes when the model does.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from counterfactory.manifests.errors import SetupError
from counterfactory.manifests.paid import PaidClient
from counterfactory.validation.scoring.backends import AnswerBackend
from counterfactory.validation.scoring.registry import ANSWER_BACKENDS

#: how to install what the backend needs (the ``vlm`` extra; torchvision must match torch's build)
INSTALL = (
    "pip install 'counterfactory[vlm]' (torch, a torchvision built for that torch, transformers); "
    "on a GPU machine install the CUDA builds of torch and torchvision first"
)
#: ``max_tokens`` of a question whose bank names none
DEFAULT_MAX_TOKENS = 256
#: the files whose names and sizes (and first and last MiB) fingerprint a model folder's weights
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
#: bytes read from each end of a weight file for its fingerprint
FINGERPRINT_BYTES = 1 << 20
#: how long a batch waits for more questions before it runs with fewer than the batch size
GATHER_S = 0.05


class TransformersOptions(BaseModel):
    """``--backend transformers``.

    Attributes:
        model: a model folder (``save_pretrained``'s, or a Hub snapshot) or a Hub id already
            in the local Hugging Face cache (``--model``).
        revision: the Hub revision of an id (a branch, tag or commit); ignored for a folder.
        device: ``auto`` (``cuda`` when torch sees a GPU, else ``cpu``), ``cpu``, ``cuda`` or
            ``cuda:N``.
        dtype: ``auto`` (bfloat16 on a GPU, float32 on the CPU), ``float32``, ``bfloat16`` or
            ``float16``; part of the lineage.
        min_pixels, max_pixels: the image processor's limits on an image's size (Qwen2-VL
            resizes each image to between them; fewer pixels, fewer image tokens); part of the
            lineage.
        system_prompt: a system message before each question; part of the lineage.
        seed: the base of every sampled question's seed; part of the lineage.
        attn_implementation: ``sdpa``, ``eager`` or ``flash_attention_2`` (None: transformers'
            choice).
    """

    model_config = ConfigDict(extra="forbid")

    model: str
    revision: str | None = None
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    dtype: str = Field("auto", pattern=r"^(auto|float32|bfloat16|float16)$")
    min_pixels: int | None = Field(None, ge=1)
    max_pixels: int | None = Field(None, ge=1)
    system_prompt: str | None = None
    seed: int = 0
    attn_implementation: str | None = None


def model_revision(folder: Path) -> str:
    """What identifies the weights in ``folder``: a Hub snapshot's commit, else a fingerprint."""
    if folder.parent.name == "snapshots" and len(folder.name) == 40:
        return folder.name
    digest = hashlib.sha256()
    config = folder / "config.json"
    digest.update(config.read_bytes() if config.is_file() else b"")
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)):
        size = path.stat().st_size
        digest.update(f"\0{path.relative_to(folder).as_posix()}\0{size}\0".encode())
        with path.open("rb") as f:
            digest.update(f.read(FINGERPRINT_BYTES))
            if size > FINGERPRINT_BYTES:
                f.seek(max(size - FINGERPRINT_BYTES, FINGERPRINT_BYTES))
                digest.update(f.read())
    return "sha256:" + digest.hexdigest()


def _cached_snapshot(model_id: str, revision: str | None) -> Path:
    """The Hugging Face cache's snapshot folder of a Hub id (nothing is downloaded)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, revision=revision, local_files_only=True))
    except Exception:  # not cached (or no huggingface_hub): say what to do
        raise SetupError(
            f"--model {model_id}: no such folder, and not in the Hugging Face cache; download it first "
            f"(hf download {model_id}{f' --revision {revision}' if revision else ''}) or pass the model's folder"
        ) from None


class _RowSampler:
    """A logits processor that samples each sampled row from its own generator (``generate``
    itself then runs greedy): a row's draw depends on its seed, not on the batch it is in."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.generators: list[Any] = [None] * len(rows)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        for i, row in enumerate(self.rows):
            temperature = float(row.get("temperature") or 0.0)
            if temperature <= 0:
                continue
            if self.generators[i] is None:
                self.generators[i] = torch.Generator(device=scores.device).manual_seed(row["seed"])
            logits = scores[i].float() / temperature
            top_p = row.get("top_p")
            if top_p is not None and float(top_p) < 1.0:
                ordered, order = torch.sort(logits, descending=True)
                cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
                drop = cumulative - torch.softmax(ordered, dim=-1) > float(top_p)
                logits[order[drop]] = float("-inf")
            token = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=self.generators[i])
            chosen = torch.full_like(scores[i], float("-inf"))
            chosen[token] = 0.0
            scores[i] = chosen
        return scores


class TransformersVLM(AnswerBackend):
    """A local vision-language model, batched ``generate`` calls on a ``DirectClient``."""

    name = "transformers"
    #: ``ask`` passes each question's answer id to :meth:`arguments` (its sampling seed)
    takes_answer_id = True

    def __init__(self, options: TransformersOptions) -> None:
        try:
            import torch
            import torchvision  # noqa: F401 - the Qwen2-VL processor's video processor needs it
            import transformers  # noqa: F401
        except ImportError as exc:
            raise SetupError(f"the transformers backend needs {exc.name or 'torch'}: {INSTALL}") from None
        self.options = options
        given = Path(os.path.expanduser(options.model))
        if given.is_dir():
            self.folder = given.resolve()
        elif given.exists() or options.model.startswith((".", "/", "~")) or options.model.count("/") > 1:
            raise SetupError(
                f"--model {options.model}: no such model folder; pass the folder save_pretrained wrote "
                "(config.json and the weights) or a Hub id in the local cache"
            )
        else:
            self.folder = _cached_snapshot(options.model, options.revision)
        device = options.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device.startswith("cuda") and not torch.cuda.is_available():
            raise SetupError(
                f"--backend-option device={device}, but torch {torch.__version__} sees no GPU: install a CUDA "
                "build of torch and torchvision (https://pytorch.org/get-started/locally/), check "
                "CUDA_VISIBLE_DEVICES, or set --backend-option device=cpu"
            )
        self.device = device
        dtype = options.dtype
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        self.dtype = dtype
        self.revision = model_revision(self.folder)
        self.batch_size = 1
        self._load_lock = threading.Lock()
        self._processor: Any = None
        self._model: Any = None
        self._pending: list[tuple[dict[str, Any], asyncio.Future]] = []
        self._last_arrival = 0.0
        self._runner: asyncio.Task | None = None
        #: ``generate`` calls made and questions they answered (tests and the summary read them)
        self.batches: list[int] = []

    def lineage(self) -> dict[str, Any]:
        o = self.options
        return {
            "backend": self.name,
            "model": o.model,
            "revision": self.revision,
            "dtype": self.dtype,
            "min_pixels": o.min_pixels,
            "max_pixels": o.max_pixels,
            "system_prompt": o.system_prompt,
            "seed": o.seed,
        }

    def client(self, *, concurrency: int, spend_cap_usd: float | None, max_retries: int) -> PaidClient:
        from counterfactory.manifests.paid.direct import DirectClient

        self.batch_size = concurrency
        return DirectClient(
            self.send,
            name="transformers",
            concurrency=concurrency,
            spend_cap_usd=spend_cap_usd,
            estimate_usd=0.0,
            max_retries=max_retries,
            backoff_s=0.1,
            transient=(),
        )

    # ------------------------------------------------------------------ the model, once

    def load(self) -> tuple[Any, Any]:
        """The processor and the model, loaded on the first call (once per run, thread-safe)."""
        with self._load_lock:
            if self._model is None:
                self._processor, self._model = self._load()
        return self._processor, self._model

    def _load(self) -> tuple[Any, Any]:
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        o = self.options
        kwargs = {k: v for k, v in (("min_pixels", o.min_pixels), ("max_pixels", o.max_pixels)) if v is not None}
        try:
            processor = AutoProcessor.from_pretrained(self.folder, **kwargs)
            model_kwargs: dict[str, Any] = {"dtype": getattr(torch, self.dtype)}
            if o.attn_implementation:
                model_kwargs["attn_implementation"] = o.attn_implementation
            model = AutoModelForImageTextToText.from_pretrained(self.folder, **model_kwargs)
        except (OSError, ValueError, ImportError) as exc:
            raise SetupError(
                f"--model {o.model}: transformers cannot load it from {self.folder} ({type(exc).__name__}: "
                f"{str(exc)[:300]}); pass a Qwen2-VL / Qwen2.5-VL class model folder, or upgrade "
                f"transformers: {INSTALL}"
            ) from None
        tokenizer = getattr(processor, "tokenizer", processor)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return processor, model.to(self.device).eval()

    # ------------------------------------------------------------------ one question

    def arguments(
        self,
        prompt: str,
        images: list[tuple[bytes, str]],
        decoding: dict[str, Any],
        sample: int,
        answer_id: str = "",
    ) -> dict[str, Any]:
        """One question's chat prompt, images and decoding settings; its sampling seed hashes the
        ``seed`` option and the answer id (which hashes the trial, lineage, decoding and sample)."""
        from PIL import Image

        processor, _ = self.load()
        content: list[dict[str, Any]] = [{"type": "image"} for _ in images]
        content.append({"type": "text", "text": prompt})
        messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
        if self.options.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": [{"type": "text", "text": self.options.system_prompt}]})
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        seed = hashlib.sha256(f"{self.options.seed}\0{answer_id}\0{int(sample)}\0{prompt}".encode()).digest()
        return {
            "text": text,
            "images": [Image.open(io.BytesIO(data)).convert("RGB") for data, _ in images],
            "temperature": float(decoding.get("temperature") or 0.0),
            "top_p": decoding.get("top_p"),
            "max_tokens": int(decoding.get("max_tokens") or DEFAULT_MAX_TOKENS),
            "seed": int.from_bytes(seed[:8], "big") >> 1,
        }

    async def send(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Queues one question; the batch it joins is answered by one ``generate`` call."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((arguments, future))
        self._last_arrival = time.monotonic()
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._pending:
            # wait for the batch to fill while questions keep arriving
            while len(self._pending) < self.batch_size and time.monotonic() - self._last_arrival < GATHER_S:
                await asyncio.sleep(GATHER_S / 10)
            batch, self._pending = self._pending[: self.batch_size], self._pending[self.batch_size :]
            try:
                results = await asyncio.to_thread(self.generate, [a for a, _ in batch])
            except BaseException as exc:  # every question of the batch fails with it
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)

    def generate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Answers ``rows`` (:meth:`arguments`' dicts) with one ``generate`` call."""
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        processor, model = self.load()
        tokenizer = getattr(processor, "tokenizer", processor)
        images = [image for row in rows for image in row["images"]]
        inputs = processor(
            text=[row["text"] for row in rows], images=images or None, padding=True, return_tensors="pt"
        ).to(self.device)
        own = model.generation_config
        eos = own.eos_token_id if own.eos_token_id is not None else tokenizer.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos])
        pad = own.pad_token_id if own.pad_token_id is not None else tokenizer.pad_token_id
        config = GenerationConfig(
            max_new_tokens=max(row["max_tokens"] for row in rows),
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        processors = LogitsProcessorList()
        if any(row["temperature"] > 0 for row in rows):
            processors.append(_RowSampler(rows))
        try:
            with torch.inference_mode():
                out = model.generate(**inputs, generation_config=config, logits_processor=processors)
        except torch.cuda.OutOfMemoryError:
            raise SetupError(
                f"out of GPU memory answering {len(rows)} questions at once: lower --concurrency (the batch "
                "size), set --backend-option max_pixels=..., or use dtype=bfloat16"
            ) from None
        self.batches.append(len(rows))
        prompt_len = inputs["input_ids"].shape[1]
        results = []
        for i, row in enumerate(rows):
            tokens = out[i, prompt_len:].tolist()[: row["max_tokens"]]
            end = next((k for k, t in enumerate(tokens) if t in stops), None)
            kept = tokens if end is None else tokens[:end]
            results.append(
                {
                    "reply": tokenizer.decode(kept, skip_special_tokens=True),
                    "finish_reason": "length" if end is None else "stop",
                    "tokens_in": int(inputs["attention_mask"][i].sum()),
                    "tokens_out": len(kept) + (0 if end is None else 1),
                }
            )
        return results

    def read(self, result: dict[str, Any]) -> dict[str, Any]:
        return {
            "reply": result.get("reply"),
            "finish_reason": result.get("finish_reason"),
            "tokens_in": result.get("tokens_in"),
            "tokens_out": result.get("tokens_out"),
            "cost_usd": 0.0,
        }


ANSWER_BACKENDS.register("transformers", TransformersOptions, TransformersVLM)
