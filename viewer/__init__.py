"""The TurboGS web viewer (viser): a trained model, or training as it happens.

    serve_model(model)      `turbogs view MODEL`: Gaussians, training cameras, screenshots
    LiveViewer(cameras)     `turbogs train --viewer`: stats, curves, error heatmaps,
                            Pause/Resume/Stop, the Gaussians as they train
"""

from .live import LiveViewer
from .saved_model import serve_model
from .server import ViewerServer

__all__ = ["LiveViewer", "ViewerServer", "serve_model"]
