"""Face landmarks, pose and face masks from the MediaPipe Face Landmarker.

One :class:`FaceLandmarker` per worker process (:func:`get_face_landmarker`) serves every
stage that needs a face: the source check, the face mask the classical editor and the
locality gate use, the region alignment keeps out of registration, and the face gate.

Reference: Kartynnik et al., "Real-time Facial Surface Geometry from Monocular Video on
Mobile GPUs" (2019) for the 468-point mesh (+10 iris points = 478); Grishchenko et al.,
"Attention Mesh" (2020); MediaPipe's 52 ARKit-style blendshape scores in [0, 1].
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import cv2
import numpy as np

from counterfactory.assets import FACE_LANDMARKER
from counterfactory.generation.masks import dilate
from counterfactory.validation.mediapipe_task import MediaPipeTask

#: MediaPipe FACEMESH_FACE_OVAL, in drawing order (36 points around the face).
FACE_OVAL = (
    10,
    338,
    297,
    332,
    284,
    251,
    389,
    356,
    454,
    323,
    361,
    288,
    397,
    365,
    379,
    378,
    400,
    377,
    152,
    148,
    176,
    149,
    150,
    136,
    172,
    58,
    132,
    93,
    234,
    127,
    162,
    21,
    54,
    103,
    67,
    109,
)
#: Closed contours of the features that are not skin (MediaPipe FACEMESH_* loops).
LEFT_EYE = (263, 249, 390, 373, 374, 380, 381, 382, 362, 398, 384, 385, 386, 387, 388, 466)
RIGHT_EYE = (33, 7, 163, 144, 145, 153, 154, 155, 133, 173, 157, 158, 159, 160, 161, 246)
LEFT_BROW = (276, 283, 282, 295, 285, 300, 293, 334, 296, 336)
RIGHT_BROW = (46, 53, 52, 65, 55, 70, 63, 105, 66, 107)
LIPS = (61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291, 409, 270, 269, 267, 0, 37, 39, 40, 185)

MaskMode = Literal["oval", "skin"]

#: Iris centres (present when the mesh has 478 points) and the fallbacks' eye contours.
RIGHT_IRIS_CENTER, LEFT_IRIS_CENTER = 468, 473
NOSE_TIP = 1
MOUTH_RIGHT_CORNER, MOUTH_LEFT_CORNER = 61, 291
#: The mesh points standing for dlib's ``shape_predictor_5_face_landmarks`` parts, in dlib's
#: part order: image-right eye outer and inner corner, image-left eye outer and inner corner,
#: bottom of the nose (subnasale). On the bundled portraits they fit dlib's 5-point mean face
#: with a residual of 1-2 % of the eye distance (the nose tip, point 1, fits at 3 %).
DLIB5_POINTS = (263, 362, 33, 133, 2)


@dataclass(frozen=True)
class FaceObservation:
    """One detected face.

    Attributes:
        landmarks: ``(478, 3)`` float32; x and y in pixels of the analysed image, z in the
            same pixel scale (MediaPipe's normalised z times the image width), smaller is nearer.
        blendshapes: the 52 blendshape scores in [0, 1] by MediaPipe category name.
        transform: ``(4, 4)`` float32 facial transformation matrix (canonical face -> camera).
    """

    landmarks: np.ndarray
    blendshapes: dict[str, float] = field(default_factory=dict)
    transform: np.ndarray | None = None

    @property
    def box(self) -> tuple[float, float, float, float]:
        """``(x0, y0, x1, y1)`` of the landmarks in pixels."""
        xy = self.landmarks[:, :2]
        x0, y0 = xy.min(axis=0)
        x1, y1 = xy.max(axis=0)
        return float(x0), float(y0), float(x1), float(y1)

    @property
    def size_px(self) -> float:
        """Geometric mean of the landmark box's width and height, in pixels."""
        x0, y0, x1, y1 = self.box
        return float(math.sqrt(max(x1 - x0, 1e-6) * max(y1 - y0, 1e-6)))

    def keypoints5(self) -> np.ndarray:
        """The five points face-recognition crops are aligned on, ``(5, 2)`` float32 pixels.

        Order (ArcFace / SFace template order, in image coordinates): image-left eye centre,
        image-right eye centre, nose tip, image-left mouth corner, image-right mouth corner.
        Eye centres are the iris centres (mesh points 468 and 473) when the mesh has them,
        else the mean of each eye's contour.
        """
        lm = self.landmarks
        if lm.shape[0] > LEFT_IRIS_CENTER:
            eye_l, eye_r = lm[RIGHT_IRIS_CENTER, :2], lm[LEFT_IRIS_CENTER, :2]
        else:
            eye_l = lm[list(RIGHT_EYE), :2].mean(axis=0)
            eye_r = lm[list(LEFT_EYE), :2].mean(axis=0)
        points = [eye_l, eye_r, lm[NOSE_TIP, :2], lm[MOUTH_RIGHT_CORNER, :2], lm[MOUTH_LEFT_CORNER, :2]]
        return np.asarray(points, dtype=np.float32)

    def dlib_points5(self) -> np.ndarray:
        """The five points of dlib's 5-point shape predictor, ``(5, 2)`` float32 pixels, in its
        part order (:data:`DLIB5_POINTS`): what FairFace aligned its face chips on."""
        return np.asarray(self.landmarks[list(DLIB5_POINTS), :2], dtype=np.float32)

    def pose_deg(self) -> tuple[float, float, float]:
        """Head pose ``(yaw, pitch, roll)`` in degrees from the transformation matrix.

        Uses the rotation part ``R`` of the matrix with the intrinsic y-x-z convention:
        yaw about the vertical axis, pitch about the horizontal axis, roll in the image plane.
        MediaPipe's camera frame has y up, so a positive roll is a counter-clockwise tilt as
        seen on screen. Falls back to the eye line for roll (same sign) and zeros for yaw and
        pitch when there is no matrix.
        """
        if self.transform is None:
            (lx, ly), (rx, ry) = self.landmarks[33, :2], self.landmarks[263, :2]
            # image y points down: negate so that counter-clockwise is positive, as above
            return 0.0, 0.0, float(math.degrees(math.atan2(-(ry - ly), rx - lx)))
        r = np.asarray(self.transform, dtype=np.float64)[:3, :3]
        # normalise away any scale the matrix carries
        r = r / np.cbrt(max(abs(np.linalg.det(r)), 1e-12))
        pitch = math.degrees(math.asin(float(np.clip(-r[1, 2], -1.0, 1.0))))
        yaw = math.degrees(math.atan2(float(r[0, 2]), float(r[2, 2])))
        roll = math.degrees(math.atan2(float(r[1, 0]), float(r[1, 1])))
        return yaw, pitch, roll


class FaceLandmarker:
    """The MediaPipe Face Landmarker, loaded once.

    Args:
        model_path: a ``face_landmarker.task`` bundle (the bundled Apache-2.0 copy by default).
        max_faces: how many faces to look for; more than one so that "two faces" is seen.
        min_detection_confidence: MediaPipe's face-detector threshold in [0, 1].
    """

    def __init__(
        self,
        model_path: str | Path = FACE_LANDMARKER,
        *,
        max_faces: int = 4,
        min_detection_confidence: float = 0.5,
    ) -> None:
        def create(vision, base_options):
            options = vision.FaceLandmarkerOptions(
                base_options=base_options,
                running_mode=vision.RunningMode.IMAGE,
                num_faces=max_faces,
                min_face_detection_confidence=min_detection_confidence,
                min_face_presence_confidence=min_detection_confidence,
                output_face_blendshapes=True,
                output_facial_transformation_matrixes=True,
            )
            return vision.FaceLandmarker.create_from_options(options)

        self._task = MediaPipeTask(
            model_path,
            create=create,
            missing=f"face landmarker model not found at {Path(model_path)}; pass the path of a "
            "face_landmarker.task bundle (the package ships one in assets/models/)",
            name="FaceLandmarker",
        )

    def close(self) -> None:
        self._task.close()

    def detect(self, image: np.ndarray) -> list[FaceObservation]:
        """Faces in ``image`` (``(H, W, 3)`` uint8 RGB), largest first."""
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"expected (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
        h, w = image.shape[:2]
        result = self._task.run("detect", image)
        faces = []
        for i, points in enumerate(result.face_landmarks):
            lm = np.array([(p.x * w, p.y * h, p.z * w) for p in points], dtype=np.float32)
            shapes = (
                {c.category_name: float(c.score) for c in result.face_blendshapes[i]} if result.face_blendshapes else {}
            )
            matrix = (
                np.asarray(result.facial_transformation_matrixes[i], dtype=np.float32)
                if result.facial_transformation_matrixes
                else None
            )
            faces.append(FaceObservation(landmarks=lm, blendshapes=shapes, transform=matrix))
        faces.sort(key=lambda f: f.size_px, reverse=True)
        return faces


def nearest_face(reference: FaceObservation, faces: Sequence[FaceObservation]) -> FaceObservation | None:
    """The face in ``faces`` whose landmark centroid is nearest ``reference``'s, or None.

    In an aligned pair the candidate's counterpart of the source's face sits where the
    source's face is; taking the candidate's *largest* face instead can pick the wrong
    person when two faces are about the same size.
    """
    if not faces:
        return None
    centre = reference.landmarks[:, :2].mean(axis=0)
    return min(faces, key=lambda f: float(np.sum((f.landmarks[:, :2].mean(axis=0) - centre) ** 2)))


_shared: dict[tuple, FaceLandmarker] = {}
_shared_lock = threading.Lock()


def get_face_landmarker(model_path: str | Path = FACE_LANDMARKER, *, max_faces: int = 4) -> FaceLandmarker:
    """The process-wide landmarker for these settings (loaded on first use)."""
    key = (str(Path(model_path).resolve()), max_faces)
    with _shared_lock:
        if key not in _shared:
            _shared[key] = FaceLandmarker(model_path, max_faces=max_faces)
        return _shared[key]


def _polygon(landmarks: np.ndarray, indices: tuple[int, ...]) -> np.ndarray:
    return np.round(landmarks[list(indices), :2]).astype(np.int32)


def face_mask(
    landmarks: np.ndarray,
    shape: tuple[int, int],
    *,
    mode: MaskMode = "oval",
    dilate_px: int = 0,
) -> np.ndarray:
    """Binary face mask from 478 landmarks.

    Args:
        landmarks: ``(478, >=2)`` landmark pixels (x, y).
        shape: ``(H, W)`` of the image the landmarks belong to.
        mode: ``"oval"``: the whole face-mesh outline, forehead to chin (what FOCUS's
            face/non-face split measures). ``"skin"``: the oval without the upper forehead
            (where hair falls), eyes, brows and lips.
        dilate_px: grow the mask by this many pixels (elliptical kernel).

    Returns:
        ``(H, W)`` uint8, 255 inside the face and 0 outside.
    """
    h, w = shape
    mask = np.zeros((h, w), np.uint8)
    cv2.fillPoly(mask, [_polygon(landmarks, FACE_OVAL)], 255)
    if mode == "skin":
        brow_y = float(np.mean(landmarks[list(LEFT_BROW + RIGHT_BROW), 1]))
        top_y = float(landmarks[10, 1])
        cut = int(round(top_y + 0.5 * (brow_y - top_y)))
        mask[: max(cut, 0)] = 0
        for loop in (LEFT_EYE, RIGHT_EYE, LEFT_BROW, RIGHT_BROW, LIPS):
            cv2.fillPoly(mask, [_polygon(landmarks, loop)], 0)
    elif mode != "oval":
        raise ValueError(f"face mask mode must be 'oval' or 'skin', got {mode!r}")
    return dilate(mask, dilate_px) if dilate_px > 0 else mask


#: Jaw points of :data:`FACE_OVAL`, from one jaw angle through the chin to the other.
JAW = (132, 58, 172, 136, 150, 149, 176, 148, 152, 377, 400, 378, 379, 365, 397, 288, 361)
#: The oval's outermost points at ear level (image-left, image-right of the mesh).
EAR_SIDES = (234, 454)
FOREHEAD_TOP, CHIN = 10, 152
#: Neck: from the jaw down this many face heights, this many jaw widths wide at the bottom.
NECK_LENGTH = 0.6
NECK_WIDTH = 0.8
#: The visible neck (with the source image): skin connected to the jaw runs on down to the
#: clothing line, as far as this many face heights below the chin (what an open collar or a
#: V-neck shows of the neck and the notch between the collarbones; skin further down is chest)
#: and no further than this share of the face's width either side of its axis (the neck, not
#: the shoulders).
NECK_MAX_LENGTH = 0.7
NECK_MAX_HALF_WIDTH = 0.5
#: Skin for the visible neck: within this CIELAB a*b* distance of the face skin's median and
#: this L* range of it (a neck in shadow is darker than the face; hair and fabric are not skin).
NECK_SKIN_AB = 14.0
NECK_SKIN_L = 35.0
#: The visible forehead (with the source image): skin connected to the forehead runs up to the
#: hairline, at most this many face heights above the mesh's top (a receding hairline, a bald
#: head); hair stops it.
FOREHEAD_MAX_RISE = 0.45
#: ... and is skin only within this many L* below the face's (hair is darker than the skin beside
#: it, for dark skin and dark hair too), this a*b* distance and this share of its chroma (hair
#: is greyer).
FOREHEAD_L_BELOW = 8.0
FOREHEAD_SKIN_AB = 10.0
FOREHEAD_MIN_CHROMA = 0.6
#: Ears: ellipses beside the oval, half-axes as shares of the face's width and height.
EAR_HALF_WIDTH, EAR_HALF_HEIGHT = 0.10, 0.20
#: Forehead: the oval's top raised by this many face heights (to the hairline; hair above it
#: is cut away by the person mask no better than by this bound).
FOREHEAD_RISE = 0.12
#: Facial hair: the lower oval grown by this share of the face size.
FACIAL_HAIR_GROW = 0.06


def visible_neck(
    image: np.ndarray, landmarks: np.ndarray, oval: np.ndarray, seed: np.ndarray, person: np.ndarray
) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: the skin connected to ``seed`` (the neck's geometric shape
    below the jaw, cut to the person) inside the neck's reach: at most :data:`NECK_MAX_LENGTH`
    face heights below the chin and :data:`NECK_MAX_HALF_WIDTH` face widths either side of the
    face's axis (:func:`connected_skin`). The clothing line stops it: fabric is not skin, and
    nothing beyond it connects."""
    down, right, height, width = _face_axes(landmarks)
    chin = landmarks[CHIN, :2].astype(np.float64)
    jaw = landmarks[list(JAW), :2].astype(np.float64)
    half = NECK_MAX_HALF_WIDTH * width
    bottom = chin + down * NECK_MAX_LENGTH * height
    reach = np.vstack([jaw, [bottom + right * half], [bottom - right * half]])
    return connected_skin(image, landmarks, oval, seed, person, reach, centre=chin, half_width=half)


def visible_forehead(
    image: np.ndarray, landmarks: np.ndarray, oval: np.ndarray, seed: np.ndarray, person: np.ndarray
) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: the forehead as a person sees it, the skin connected to
    ``seed`` (the forehead above the mesh) up to the hairline, at most
    :data:`FOREHEAD_MAX_RISE` face heights above the mesh's top and no wider than the face
    (:func:`connected_skin`): a receding hairline or a bald head shows more forehead than the
    mesh, and a tone change of the face reaches it. Hair is not skin and stops it."""
    down, right, height, width = _face_axes(landmarks)
    oval_pts = landmarks[list(FACE_OVAL), :2].astype(np.float64)
    top = landmarks[FOREHEAD_TOP, :2].astype(np.float64)
    reach = np.vstack([oval_pts, oval_pts - down * FOREHEAD_MAX_RISE * height])
    # hair is darker and greyer than the skin beside it, most of all where both are dark:
    # the forehead takes only skin no darker than the face by FOREHEAD_L_BELOW and as saturated
    return connected_skin(
        image,
        landmarks,
        oval,
        seed,
        person,
        reach,
        centre=top,
        half_width=0.5 * width,
        l_range=(FOREHEAD_L_BELOW, NECK_SKIN_L),
        ab=FOREHEAD_SKIN_AB,
        min_chroma=FOREHEAD_MIN_CHROMA,
    )


def connected_skin(
    image: np.ndarray,
    landmarks: np.ndarray,
    oval: np.ndarray,
    seed: np.ndarray,
    person: np.ndarray,
    reach: np.ndarray,
    *,
    centre: np.ndarray,
    half_width: float,
    l_range: tuple[float, float] = (-NECK_SKIN_L, NECK_SKIN_L),
    ab: float = NECK_SKIN_AB,
    min_chroma: float = 0.0,
) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: skin pixels inside the convex hull of ``reach`` (points,
    pixels) and within ``half_width`` pixels of ``centre`` across the face's axis, connected to
    ``seed`` or the oval. Skin is a ``person`` pixel whose CIELAB lies within ``ab`` (a*b*)
    of the face skin's median (the oval eroded off hair and background), whose L* differs from
    it by ``l_range`` (below, above), and whose chroma is at least ``min_chroma`` of the face's.

    ``image`` ``(H, W, 3)`` uint8 RGB; ``oval`` and ``seed`` ``(H, W)`` {0, 255}; ``person``
    ``(H, W)`` bool. Computed inside the reach's bounding box only."""
    h, w = oval.shape[:2]
    _, right, height, width = _face_axes(landmarks)
    hull = np.zeros((h, w), np.uint8)
    cv2.fillPoly(hull, [np.round(cv2.convexHull(reach.astype(np.float32))).astype(np.int32)], 255)
    x, y, bw, bh = cv2.boundingRect(hull)
    out = np.zeros((h, w), np.uint8)
    if bw == 0 or bh == 0:
        return out
    ys, xs = np.mgrid[y : y + bh, x : x + bw]
    across = (xs - centre[0]) * right[0] + (ys - centre[1]) * right[1]
    box = hull[y : y + bh, x : x + bw]
    box[np.abs(across) > half_width] = 0
    core = cv2.erode(oval, np.ones((3, 3), np.uint8), iterations=max(1, int(0.05 * math.sqrt(height * width))))
    if cv2.countNonZero(core) == 0:
        core = oval
    face_lab = _lab(np.ascontiguousarray(image[core > 0]).reshape(-1, 1, 3)).reshape(-1, 3)
    ref = np.median(face_lab, axis=0)
    lab = _lab(np.ascontiguousarray(image[y : y + bh, x : x + bw]))
    dl = lab[..., 0] - ref[0]
    skin = (np.linalg.norm(lab[..., 1:] - ref[1:], axis=2) <= ab) & (dl >= -abs(l_range[0])) & (dl <= l_range[1])
    if min_chroma > 0:
        skin &= np.hypot(lab[..., 1], lab[..., 2]) >= min_chroma * float(np.hypot(ref[1], ref[2]))
    candidates = (skin & person[y : y + bh, x : x + bw] & (box > 0)).astype(np.uint8)
    # the oval's own pixels join the seed, so skin connects through the face
    touch = (seed[y : y + bh, x : x + bw] > 0) | (oval[y : y + bh, x : x + bw] > 0)
    count, labels = cv2.connectedComponents(candidates | touch.astype(np.uint8), connectivity=8)
    if count <= 1:
        return out
    keep = np.zeros(count, bool)
    keep[np.unique(labels[touch])] = True
    keep[0] = False
    out[y : y + bh, x : x + bw][keep[labels] & (candidates > 0)] = 255
    return out


def _lab(rgb: np.ndarray) -> np.ndarray:
    """float32 CIELAB (D65) of uint8 sRGB, any shape ``(..., 3)`` OpenCV takes."""
    return cv2.cvtColor(rgb.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)


def _face_axes(landmarks: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """``(down, right, height, width)``: unit vectors of the face's own vertical (forehead top
    to chin) and horizontal axes, and its height and width in pixels along them."""
    top, chin = landmarks[FOREHEAD_TOP, :2].astype(np.float64), landmarks[CHIN, :2].astype(np.float64)
    down = chin - top
    height = float(np.linalg.norm(down))
    down = down / max(height, 1e-6)
    right = np.array([-down[1], down[0]])
    oval = landmarks[list(FACE_OVAL), :2].astype(np.float64)
    across = oval @ right
    return down, right, max(height, 1.0), max(float(across.max() - across.min()), 1.0)


def region_mask(
    landmarks: np.ndarray,
    shape: tuple[int, int],
    region: str = "face",
    *,
    person: np.ndarray | None = None,
    image: np.ndarray | None = None,
) -> np.ndarray:
    """``(H, W)`` uint8 {0, 255}: the edit region ``region`` names
    (:data:`~counterfactory.generation.regions.REGIONS`), drawn for one face.

    - ``face``: the face-mesh oval.
    - ``face_neck_ears``: the oval, the forehead above it up to :data:`FOREHEAD_RISE` face
      heights, the lower oval grown by :data:`FACIAL_HAIR_GROW` of the
      face size (beard, moustache, sideburns), an ellipse beside each ear-level point of the
      oval, and the neck: the jaw line (:data:`JAW`) extended down the face's own axis by
      :data:`NECK_LENGTH` face heights, widening to :data:`NECK_WIDTH` of the face's width at
      the bottom. With ``person`` the ears and neck are cut to the person (the background
      beside the neck is not the neck). With ``image`` too, the neck is the neck a person
      sees: the skin connected to that shape runs on down to the clothing line (what an open
      collar or a V-neck shows), at most :data:`NECK_MAX_LENGTH` face heights below the chin
      and :data:`NECK_MAX_HALF_WIDTH` face widths either side of the face's axis
      (:func:`visible_neck`); skin further down or out is chest and shoulders, outside it. The
      forehead likewise runs up to the hairline (:func:`visible_forehead`).
    - ``all_visible_skin``: the oval and the whole person (with ``person``; the whole image
      without).

    Args:
        landmarks: ``(478, >=2)`` landmark pixels (x, y).
        shape: ``(H, W)``.
        region: a region name.
        person: ``(h, w)`` person probability in [0, 1] (or {0, 255} mask) of the image or of
            its working grid (resized to ``shape`` here), or None.
        image: ``(H, W, 3)`` uint8 RGB, the photo itself (with ``person``: the visible neck).
    """
    from counterfactory.generation.regions import get_region

    spec = get_region(region)
    h, w = shape
    oval = face_mask(landmarks, shape, mode="oval")
    if not (spec.neck or spec.ears or spec.facial_hair or spec.forehead or spec.all_skin):
        return oval
    body = None
    if person is not None:
        p = np.asarray(person)
        p = p.astype(np.float32) / 255.0 if p.dtype == np.uint8 else p.astype(np.float32)
        if p.shape[:2] != (h, w):
            p = cv2.resize(p, (w, h), interpolation=cv2.INTER_LINEAR)
        body = p >= 0.5
    if spec.all_skin:
        out = oval.copy()
        if body is None:
            out[:] = 255
        else:
            out[body] = 255
        return out
    down, right, height, width = _face_axes(landmarks)
    extra = np.zeros((h, w), np.uint8)
    if spec.neck:
        jaw = landmarks[list(JAW), :2].astype(np.float64)
        chin = landmarks[CHIN, :2].astype(np.float64)
        bottom = chin + down * NECK_LENGTH * height
        half = 0.5 * NECK_WIDTH * width
        polygon = np.vstack([jaw, [bottom + right * half], [bottom - right * half]])
        # the jaw chain runs across the face; order the two bottom corners to close it
        if float((jaw[-1] - jaw[0]) @ right) < 0:
            polygon[-2:] = polygon[-2:][::-1]
        cv2.fillPoly(extra, [np.round(polygon).astype(np.int32)], 255)
        if image is not None and body is not None and image.shape[:2] == (h, w):
            neck = np.zeros((h, w), np.uint8)
            cv2.fillPoly(neck, [np.round(polygon).astype(np.int32)], 255)
            extra = cv2.bitwise_or(extra, visible_neck(image, landmarks, oval, neck & (body * np.uint8(255)), body))
    if spec.forehead:
        # the oval moved up its own axis by FOREHEAD_RISE face heights, joined to the oval
        oval_pts = landmarks[list(FACE_OVAL), :2].astype(np.float64)
        raised = oval_pts - down * FOREHEAD_RISE * height
        hull = cv2.convexHull(np.round(np.vstack([oval_pts, raised])).astype(np.int32))
        top = np.zeros((h, w), np.uint8)
        cv2.fillPoly(top, [hull], 255)
        # only above the brows: the sides of the face are the oval's
        brow = landmarks[list(LEFT_BROW + RIGHT_BROW), :2].astype(np.float64).mean(axis=0)
        x, y, bw, bh = cv2.boundingRect(top)
        ys, xs = np.mgrid[y : y + bh, x : x + bw]
        above = ((xs - brow[0]) * down[0] + (ys - brow[1]) * down[1]) < 0
        box = top[y : y + bh, x : x + bw]
        box[~above] = 0
        extra = cv2.bitwise_or(extra, top)
        if image is not None and body is not None and image.shape[:2] == (h, w):
            extra = cv2.bitwise_or(extra, visible_forehead(image, landmarks, oval, top & (body * np.uint8(255)), body))
    if spec.ears:
        angle = float(np.degrees(np.arctan2(right[1], right[0])))
        axes = (max(int(round(EAR_HALF_WIDTH * width)), 1), max(int(round(EAR_HALF_HEIGHT * height)), 1))
        centre_x = landmarks[list(EAR_SIDES), :2].astype(np.float64) @ right
        outward = np.where(centre_x == centre_x.min(), -1.0, 1.0)
        for idx, sign in zip(EAR_SIDES, outward, strict=True):
            c = landmarks[idx, :2].astype(np.float64) + right * sign * 0.5 * EAR_HALF_WIDTH * width
            cv2.ellipse(extra, (int(round(c[0])), int(round(c[1]))), axes, angle, 0, 360, 255, -1)
    if body is not None:
        extra[~body] = 0
    out = cv2.bitwise_or(oval, extra)
    if spec.facial_hair:
        grown = dilate(oval, max(int(round(FACIAL_HAIR_GROW * math.sqrt(height * width))), 1))
        # only below the nose: the hairline above is not facial hair
        nose = landmarks[NOSE_TIP, :2].astype(np.float64)
        x, y, bw, bh = cv2.boundingRect(grown)
        ys, xs = np.mgrid[y : y + bh, x : x + bw]
        below = ((xs - nose[0]) * down[0] + (ys - nose[1]) * down[1]) >= 0
        box = out[y : y + bh, x : x + bw]
        box[(grown[y : y + bh, x : x + bw] > 0) & below] = 255
    return out
