"""From boxes to objects: tracking per camera, and one object list for the rig.

* `bytetrack`: `ByteTracker`, ByteTrack over each camera's boxes, a batch of cameras at a
  time (a Kalman motion model, `kalman`; two-stage association of high- and low-score boxes;
  tracks that survive misses, found again by motion and by looks, `recovery`);
  `camera_tracker`: `CameraTracker`, that tracker for one camera.
* `appearance`: what a box looks like (its colours, a small unit vector), read from the
  frame, so that the tracker tells apart objects its motion model cannot; `LooksReader`, the
  stage's seam for looks of another kind.
* `fusion`: `RigFusion`, each track's ground contact point placed in the ego frame with the
  rig's geometry, and tracks of cameras that see one object joined under one global id.
* `stage`: `RigTracker`, both as the pipeline stage that runs on the completion thread.

Pure steps over numpy arrays (and scipy's assignment, OpenCV's resize for the looks), tested
on their own; they import types, geometry and rig only.
"""
