"""Looking at a deployment: the monitoring endpoint (:mod:`.http`, :mod:`.exporter`),
cluster-wide status (:mod:`.status`) and set-up checks (:mod:`.doctor`)."""
