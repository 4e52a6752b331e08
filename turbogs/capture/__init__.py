"""From photos or a video to a COLMAP model, in our process: folder scan (photos), video frames
(frames), structure from motion through pycolmap (sfm) and what it tells the user (summary).
`prepare` turns what `turbogs train` / `turbogs sfm` were given into a capture folder with a model."""
