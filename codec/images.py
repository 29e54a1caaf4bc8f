"""Reading and writing images at the codec's boundary: allowed formats, size limits, RGB uint8 arrays.

Images are decoded with Pillow from bytes, checked *before* any pixel is decoded (format and size come from
the header), converted to RGB (alpha is dropped, greyscale is replicated) and returned as (H, W, 3) uint8.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image

from .errors import ImageError, ImageTooLarge

FORMATS = ("PNG", "JPEG", "BMP", "PPM", "TIFF", "WEBP")
MAX_PIXELS = 4096 * 4096  # 16.8 MP; the header stores each side in 16 bits
MAX_WORK_MB = 2048.0  # default coding-memory budget: images up to about 750 x 750 pixels (the prior's cells dominate)
MAX_SIDE = 65535
MIN_SIDE = 8
# the bundled photos never trained on (``cat`` is chelsea under another name and is never trained on either)
HELD_OUT = ("astronaut", "coffee", "chelsea")


def check_size(height: int, width: int, max_pixels: int = MAX_PIXELS) -> None:
    """Refuse images the codec cannot or will not code; the message names the limit."""
    if height < MIN_SIDE or width < MIN_SIDE:
        raise ImageError(f"image size: expected both sides >= {MIN_SIDE} pixels, received {height}x{width}")
    if height > MAX_SIDE or width > MAX_SIDE or height * width > max_pixels:
        raise ImageTooLarge(f"image size: expected at most {max_pixels} pixels and sides <= {MAX_SIDE}, "
                            f"received {height}x{width} = {height * width} pixels")


def load_image(data: bytes, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """File bytes -> (H, W, 3) uint8; refuses unknown formats and oversize images before decoding pixels."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) == 0:
        raise ImageError(f"image: expected the bytes of an image file ({', '.join(FORMATS)}), received "
                         f"{'an empty payload' if isinstance(data, (bytes, bytearray, memoryview)) else type(data).__name__}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(bytes(data)), formats=FORMATS)
    except (Image.UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"image format: expected one of {', '.join(FORMATS)}, received an unreadable or other "
                         f"file ({type(exc).__name__})") from None
    check_size(img.height, img.width, max_pixels)
    try:
        rgb = img.convert("RGB")
    except (OSError, ValueError) as exc:
        raise ImageError(f"image data: the {img.format} file is truncated or corrupt ({exc})") from None
    return np.asarray(rgb, dtype=np.uint8)


def bundled(names: tuple[str, ...] = HELD_OUT) -> dict[str, np.ndarray]:
    """Bundled ``skimage.data`` photos by name as (H, W, 3) uint8 (greyscale replicated; nothing downloaded)."""
    import skimage.data

    out = {}
    for name in names:
        image = getattr(skimage.data, name)()
        image = np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image[..., :3]
        out[name] = np.ascontiguousarray(image).astype(np.uint8)
    return out


def load_folder(folder: str | Path, max_pixels: int = MAX_PIXELS) -> dict[str, np.ndarray]:
    """Every image file of a folder (sorted by name), or the held-out photos for ``heldout``; refuses none."""
    if str(folder) == "heldout":
        return bundled()
    folder = Path(folder)
    if not folder.is_dir():
        raise ImageError(f"images: expected a folder (or 'heldout'), received {str(folder)!r}")
    paths = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    images = {p.name: load_image(p.read_bytes(), max_pixels) for p in paths}
    if not images:
        raise ImageError(f"images: expected image files in {str(folder)!r}, found none")
    return images


def png_bytes(pixels: np.ndarray) -> bytes:
    """(H, W, 3) uint8 -> PNG file bytes (lossless; what decode writes)."""
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()
