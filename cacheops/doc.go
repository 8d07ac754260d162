// Package cacheops applies the daemon's cache ops (rules.Op: namespace
// bumps, set tokens, set rebuilds and deletes, counter deltas and
// recounts) to memcached: the apply step of fetch, decode, plan,
// coalesce, apply, commit.
//
// One state machine, Applier (apply.go, steps.go), decides each op kind's
// memcached commands and what every answer means; a transport carries
// them (transport.go): the pipelined meta protocol (NewMetaApplier,
// meta.go, over internal/metaproto) or the text protocol through
// gomemcache (NewTextApplier) for mcrouter, twemproxy and memcached
// before 1.6; Config (config.go) tunes both. Around it: the results of
// an Apply (result.go), which errors are worth a retry (errors.go:
// Retryable, for memcached, MySQL and network errors), evidence marks on
// master items (evidence.go), and the token log the delayed bumps keep in
// memcached (tokenlog.go).
//
// It is not the read side (package client) and holds no item format
// (package itemformat); exact, fenced counter recounts are package
// counters'. Everything exported is safe for concurrent use.
package cacheops
