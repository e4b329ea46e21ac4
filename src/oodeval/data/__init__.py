"""Datasets: manifests, image loading and the named-benchmark registry.

``resolve(name_or_path, data_root)`` turns a registry name, a user dataset under the data root
(``<data_root>/<name>/manifest.csv``), an image folder or a CSV manifest into a :class:`Manifest`.
The data root is ``--data-root DIR`` or ``$OODEVAL_DATA``.
"""

from .images import ImageError, open_image, read_idx
from .manifest import IMAGE_EXTENSIONS, Manifest, list_images
from .datasets import REGISTRY, DatasetSpec, default_data_root, register_dataset, resolve, status

__all__ = [
    "IMAGE_EXTENSIONS", "REGISTRY", "DatasetSpec", "ImageError", "Manifest", "default_data_root",
    "list_images", "open_image", "read_idx", "register_dataset", "resolve", "status",
]
