// Package integration runs cachewarden end to end: a Kafka-protocol broker,
// a MySQL/MariaDB database that a workload changes, the change events that
// workload publishes in every format cachewarden reads, daemons built from
// a config exactly as `cachewarden run` builds them, and checks that the
// cache they keep agrees with the database.
//
// The non-test files are a harness shared by the package's tests and by
// the demo command, cmd/cachewarden-demo (`make demo`; the production
// binary links none of this):
//
//   - StartBroker connects to a broker, or starts one in this process
//     (github.com/twmb/franz-go/pkg/kfake), and answers lag questions
//     (GroupLag, WaitCaughtUp) from the group's committed offsets;
//   - Schema and Workload create the example tables (those configs/rules
//     describes) and apply inserts, updates that move rows between keys,
//     predicate flips, edits of unwatched columns and deletes, reporting
//     each committed transaction with its before and after images;
//   - Encode and Publisher turn those into Debezium (with and without the
//     schema envelope), flattened Debezium, Maxwell or Canal messages and
//     publish them in commit order, keyed like the connectors key them;
//     the broker's admin requests, reads and the Publisher all use
//     franz-go, the daemon's Kafka client, so the cachewarden binary,
//     which embeds the demo, links no second Kafka client;
//   - StartDaemon runs a daemon in this process; Warm reads the cache as an
//     application would; Scenario.Check runs package verify over every set
//     and counter and checks that every namespace a change concerned moved
//     and every other one stayed.
//
// The harness never imports the testing package: callers pass service
// addresses in (the tests find them with internal/testsvc).
//
// What "the cache agrees" can mean is bounded by two properties of the
// design that the workload respects rather than hides:
//
//   - a daemon orders events per partition only. Messages are keyed by
//     primary key (Debezium, which reports a primary-key change as a delete
//     and a create) or partitioned by table (Maxwell, Canal), and every set
//     membership of the schema is held by the row it names, so the changes
//     of one membership stay in order;
//   - a counter recount reads the database's present state. When that is
//     ahead of the stream by a later change of the same counter, the change
//     is counted twice once its event is applied. Workload.Round therefore
//     changes each counter at most once, and callers let the daemons catch
//     up between rounds.
package integration
