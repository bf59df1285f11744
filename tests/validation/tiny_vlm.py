"""Tiny, randomly initialised Qwen2-VL and Qwen2.5-VL models and their processors, built locally
(nothing is downloaded), and the reference replies of ``model.generate`` called directly: the
helpers of ``tests/validation/scoring/test_transformers_backend.py``, run as a script in an environment with
torchvision (``python tiny_vlm.py build OUT [SEED] [--family qwen2_vl|qwen2_5_vl]``;
``python tiny_vlm.py generate MODEL QUESTIONS.json``).

The tokenizer is byte-level BPE over the 256 byte symbols (no merges) plus Qwen2-VL's special
tokens (Qwen2.5-VL's are the same), with a chat template that writes their prompt
(``<|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>...<|im_end|>\\n<|im_start|>assistant\\n``).
The models' sizes are those of transformers' own tests: Qwen2-VL's (two layers of width 32, a
two-layer vision tower) and Qwen2.5-VL's (four layers of width 32, a two-layer vision tower with
its RMSNorm, gated MLP and merger to width 32); the Qwen2.5-VL tower's first layer attends within
windows of one merged patch (2 x 2 patches) and its second over the whole image, so both of its
attention paths run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>"]  # fmt: skip
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'text' %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)
#: each image resized to 2 x 2 merged patches at most: 4 image tokens
MAX_PIXELS = 56 * 56


FAMILIES = ("qwen2_vl", "qwen2_5_vl")


def build(out: Path, seed: int = 0, family: str = "qwen2_vl") -> Path:
    """Saves a tiny model of ``family`` (Qwen2-VL or Qwen2.5-VL; weights drawn with ``seed``) and
    its processor in ``out``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: one of {', '.join(FAMILIES)}")
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    ids = {t: fast.convert_tokens_to_ids(t) for t in SPECIAL}
    processor_class = Qwen2_5_VLProcessor if family == "qwen2_5_vl" else Qwen2VLProcessor
    processor = processor_class(
        image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=MAX_PIXELS),
        tokenizer=fast,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=TEMPLATE,
    )
    torch.manual_seed(seed)
    tokens = {
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
    }  # fmt: skip
    special = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
               "pad_token_id": ids["<|endoftext|>"]}  # fmt: skip
    if family == "qwen2_vl":
        config = Qwen2VLConfig(
            text_config={
                "vocab_size": len(fast), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]},
                **special,
            },
            vision_config={"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 4, "mlp_ratio": 2,
                           "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
            **tokens,
        )  # fmt: skip
        model = Qwen2VLForConditionalGeneration(config).eval()
    else:  # transformers' Qwen2.5-VL test sizes; the processor's 2 x 2 merge, windows of one merged patch
        config = Qwen2_5_VLConfig(
            text_config={
                "vocab_size": len(fast), "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 4,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
                "max_window_layers": 3,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
                **special,
            },
            vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 32, "out_hidden_size": 32,
                           "num_heads": 4, "hidden_act": "silu", "patch_size": 14, "spatial_merge_size": 2,
                           "temporal_patch_size": 2, "window_size": 28, "fullatt_block_indexes": [1]},
            **tokens,
        )  # fmt: skip
        model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def generate(model_dir: Path, questions: list[dict]) -> list[str]:
    """Each question (``{"prompt", "images": [paths], "max_tokens"}``) answered alone by
    ``model.generate`` with greedy decoding: what the backend must reply under temperature 0."""
    import torch
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    replies = []
    for q in questions:
        content = [{"type": "image"} for _ in q["images"]] + [{"type": "text", "text": q["prompt"]}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        images = [Image.open(p).convert("RGB") for p in q["images"]] or None
        inputs = processor(text=[text], images=images, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**inputs, do_sample=False, max_new_tokens=q["max_tokens"])
        new = out[0, inputs["input_ids"].shape[1] :]
        replies.append(processor.tokenizer.decode(new, skip_special_tokens=True))
    return replies


if __name__ == "__main__":
    if sys.argv[1] == "build":
        args = sys.argv[2:]
        family = "qwen2_vl"
        if "--family" in args:
            at = args.index("--family")
            family, args = args[at + 1], args[:at] + args[at + 2 :]
        build(Path(args[0]), seed=int(args[1]) if len(args) > 1 else 0, family=family)
    elif sys.argv[1] == "generate":
        print(json.dumps(generate(Path(sys.argv[2]), json.loads(Path(sys.argv[3]).read_text()))))
