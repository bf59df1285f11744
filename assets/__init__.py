"""Bundled data: demo photos and metadata, prompt templates, example specs, open models."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
MODELS_DIR = ASSETS_DIR / "models"
PHOTOS_DIR = ASSETS_DIR / "photos"
SPECS_DIR = ASSETS_DIR / "specs"
PROMPTS_DIR = ASSETS_DIR / "prompts"

FACE_LANDMARKER = MODELS_DIR / "face_landmarker.task"
SFACE = MODELS_DIR / "face_recognition_sface_2021dec.onnx"
FACE_DETECTOR = MODELS_DIR / "face_detection_short_range.tflite"
SELFIE_SEGMENTER = MODELS_DIR / "selfie_segmentation.tflite"
