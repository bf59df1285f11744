"""A tiny, randomly initialised Qwen-Image-Edit pipeline that is built offline.

Same component classes and folder layout as ``Qwen/Qwen-Image-Edit`` (text encoder
``Qwen2_5_VLForConditionalGeneration``, ``QwenImageTransformer2DModel``,
``AutoencoderKLQwenImage``, ``FlowMatchEulerDiscreteScheduler``, ``Qwen2Tokenizer`` and a
``Qwen2VLProcessor`` folder), with a few thousand parameters each, after diffusers' own fast
tests (``tests/pipelines/qwenimage/test_qwenimage_edit.py``). Those tests fetch a tiny
tokenizer from the hub; this one is a byte-level BPE without merges (every byte is a token,
as in Qwen's tokenizer before merges) plus the special tokens the pipelines' prompt
templates use, so nothing is downloaded.

The pipelines always work at about one megapixel, whatever the source size, so the VAE
downsamples 16x (the real one 8x): that makes the transformer's sequence and the VAE's
attention small enough for a CPU; every code path is the same.

Run as a script to write one for the benchmark's smoke test::

    python tests/generation/conftest_qwen.py /tmp/tiny-qwen
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

#: Special tokens of Qwen2.5-VL that the Qwen-Image-Edit prompt templates and the Qwen2-VL
#: processor rely on.
SPECIAL_TOKENS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

#: The processor's pixel budget for the text encoder's view of the image: 4x4 merged tokens
#: at most (the real model allows about 1,280), which keeps the tiny vision tower cheap.
MAX_PIXELS = 56 * 56 * 4


def build_tiny_tokenizer() -> Any:
    """A Qwen2 byte-level BPE tokenizer: 256 byte tokens, ``<|endoftext|>`` and the specials."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    return tokenizer


def build_tiny_components(seed: int = 0) -> dict[str, Any]:
    """The pipeline's components, without the processor (see :func:`write_processor`)."""
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = build_tiny_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")

    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=3,
        joint_attention_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(8, 4, 4),
    )
    torch.manual_seed(seed)
    z_dim = 4
    vae = AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=z_dim,
        dim_mult=[1, 2, 2, 2, 2],
        num_res_blocks=1,
        temperal_downsample=[False, True, True, True],
        latents_mean=[0.0] * z_dim,
        latents_std=[1.0] * z_dim,
    )
    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(
        text_config={
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
            "rope_theta": 1000000.0,
            "vocab_size": len(tokenizer),
            "bos_token_id": eos,
            "eos_token_id": eos,
        },
        vision_config={
            "depth": 2,
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_heads": 2,
            "out_hidden_size": 16,
        },
        hidden_size=16,
        vocab_size=len(tokenizer),
        bos_token_id=eos,
        eos_token_id=eos,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    text_encoder = Qwen2_5_VLForConditionalGeneration(config)
    return {
        "transformer": transformer,
        "vae": vae,
        "scheduler": FlowMatchEulerDiscreteScheduler(),
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
    }


def build_image_processor() -> Any:
    """The Qwen2-VL image processor (PIL backend: no torchvision) with a small pixel budget."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=MAX_PIXELS)


def image_only_processor(tokenizer: Any, image_processor: Any) -> Any:
    """A ``Qwen2VLProcessor`` without its video half, for building pipelines in memory.

    transformers checks every sub-processor's class, and the video processor class needs
    torchvision; editing never uses it.
    """
    from transformers import Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kw: Any):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kw)

    return ImageOnlyQwen2VLProcessor(image_processor=image_processor, tokenizer=tokenizer)


def write_processor(folder: Path, tokenizer: Any, image_processor: Any) -> None:
    """Write ``processor/`` as ``Qwen2VLProcessor.save_pretrained`` does for the real model."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    image_processor.save_pretrained(folder)
    config = json.loads((folder / "preprocessor_config.json").read_text())
    config["processor_class"] = "Qwen2VLProcessor"
    (folder / "preprocessor_config.json").write_text(json.dumps(config, indent=2))
    # the stock loader (with torchvision) reads this; its defaults are those of Qwen2-VL
    video = {
        "video_processor_type": "Qwen2VLVideoProcessor",
        "processor_class": "Qwen2VLProcessor",
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "min_pixels": 56 * 56,
        "max_pixels": MAX_PIXELS,
    }
    (folder / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))


def build_tiny_qwen_pipeline(
    path: str | Path, *, class_name: str = "QwenImageEditPipeline", seed: int = 0
) -> dict[str, Any]:
    """Write a tiny pipeline folder at ``path`` and return its components in memory.

    Args:
        path: the folder to create (``save_pretrained`` layout).
        class_name: ``_class_name`` recorded in ``model_index.json``:
            ``QwenImageEditPipeline`` (Qwen-Image-Edit) or ``QwenImageEditPlusPipeline``
            (Qwen-Image-Edit-2509); the weights are the same.
        seed: torch seed of the random initialisation.

    Returns:
        The components (``transformer``, ``vae``, ``scheduler``, ``text_encoder``,
        ``tokenizer``, ``processor``) as written, for building the same pipeline in memory.
    """
    import diffusers

    path = Path(path)
    components = build_tiny_components(seed)
    image_processor = build_image_processor()
    pipe = getattr(diffusers, class_name)(**components, processor=None)
    pipe.save_pretrained(path)
    write_processor(path / "processor", components["tokenizer"], image_processor)
    index = json.loads((path / "model_index.json").read_text())
    index["processor"] = ["transformers", "Qwen2VLProcessor"]
    (path / "model_index.json").write_text(json.dumps(index, indent=2))
    components["processor"] = image_only_processor(components["tokenizer"], image_processor)
    return components


def write_tiny_lora(path: str | Path, transformer: Any, *, rank: int = 4, seed: int = 1) -> Path:
    """Write a random LoRA for ``transformer`` in diffusers' format; returns the ``.safetensors`` file.

    ``init_lora_weights=False`` makes both LoRA matrices random, so fusing it changes outputs.
    """
    import copy

    import torch
    from diffusers import QwenImageEditPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    model = copy.deepcopy(transformer)
    torch.manual_seed(seed)
    # the layers Lightning LoRAs adapt: attention, image MLP and the AdaLN modulation
    targets = ["to_q", "to_k", "to_v", "to_out.0", "img_mlp.net.2", "img_mod.1"]
    model.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights=False))
    folder = Path(path)
    QwenImageEditPipeline.save_lora_weights(folder, transformer_lora_layers=get_peft_model_state_dict(model))
    return folder / "pytorch_lora_weights.safetensors"


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-qwen-image-edit")
    build_tiny_qwen_pipeline(target)
    print(target)
