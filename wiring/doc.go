// Package wiring builds what the run, replay, observe and demo commands
// need from one config file (NewStack): the memcached client and
// appliers, counters and MySQL, the pipeline, the Kafka source's
// settings, the schema registry, the dead-letter topic, the observer,
// the metrics registry and the HTTP endpoints. Of the pipeline and the
// sources it is the only package that imports config.
//
// Files: stack.go (Stack), counters.go (exact counters and their
// metrics), observer.go (the consistency observer), replayfile.go (the
// decoder of a replay file), http.go (/metrics, /healthz, /readyz,
// /version, pprof) and buildinfo.go.
package wiring
