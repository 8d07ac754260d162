// Package metaproto speaks memcached's meta protocol (memcached 1.6 and
// later), pipelined, over pools of persistent connections: the wire layer
// under the daemon's pipelined transport (cacheops) and the read side's
// leases (package client, through Client). It encodes commands, reads and
// places replies, and routes each key to the server a
// memcache.ServerSelector picks (the same selector as the gomemcache
// clients, so routing is identical by construction). It decides nothing
// about items: which commands an op needs and what a reply means for it
// is cacheops' business, item formats are package itemformat's.
//
// One exchange writes many commands on one connection in a single write and
// then reads their replies in bulk. Every command carries an opaque token
// O<i>, i being its index in the exchange, which memcached copies into its
// reply. Commands that may be quiet (flag q) send no reply when they
// succeed, so a pipeline of successful appends reads back next to nothing.
//
// memcached answers errors (CLIENT_ERROR, SERVER_ERROR, ERROR) without the
// opaque token, so an error line can only be placed by its position and
// its kind: replies come back in command order, so the error belongs to
// one of the commands between the last reply that could be placed and the
// next one, and some errors can come from one verb only. To keep that
// window small an exchange puts a no-op (mn, answered MN) after every
// anchorEvery commands and at its end; the final MN also tells the
// reader that every reply has arrived. When the error lines of a window
// cannot be matched to its commands exactly, the candidates are marked
// resendable: each either succeeded silently or failed, and is sent again
// without q (see Reply.Resend). Only commands whose repetition is
// harmless may be quiet.
//
// Everything here is safe for concurrent use except a Conn, which one
// exchange holds at a time (Pool.Acquire, Pool.Release).
package metaproto
