"""From boxes to objects: tracking per camera, and one object list for the rig.

* `bytetrack`: `CameraTracker`, ByteTrack over one camera's boxes (a Kalman motion model,
  `kalman`; two-stage association of high- and low-score boxes; tracks that survive misses).
* `fusion`: `RigFusion`, each track's ground contact point placed in the ego frame with the
  rig's geometry, and tracks of cameras that see one object joined under one global id.
* `stage`: `RigTracker`, both as the pipeline stage that runs on the completion thread.

Pure steps over numpy arrays (and scipy's assignment), tested on their own; they import
types, geometry and rig only.
"""
