// Command cwbroker runs a single-node, in-memory Kafka-protocol broker
// (github.com/twmb/franz-go/pkg/kfake) on a loopback port until it receives
// SIGINT or SIGTERM. The benchmark harness (cwbench) starts it as a process
// of its own so that the broker's CPU time is not charged to the consumer
// being measured.
//
// Usage:
//
//	cwbroker -port 9092 [-topics a,b] [-partitions 4] [-segment-bytes 8388608] [-pprof 127.0.0.1:6061]
//
// Once the broker listens it prints "listening 127.0.0.1:PORT" on stdout.
// Records are kept in memory for the broker's lifetime.
package main

import (
	"flag"
	"fmt"
	"net/http"
	_ "net/http/pprof"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	port := flag.Int("port", 0, "loopback port to listen on (0: a free one)")
	topics := flag.String("topics", "", "comma-separated topics to create at start")
	partitions := flag.Int("partitions", 4, "partitions of the seeded topics and of auto-created ones")
	segmentBytes := flag.Int64("segment-bytes", 8<<20, "log.segment.bytes: the broker keeps each segment in one growing buffer, copied whole as it doubles; small segments keep those copies (and the pauses of the broker's request loop) short")
	pprofAddr := flag.String("pprof", "", "address to serve net/http/pprof on (e.g. 127.0.0.1:6061); off when empty")
	flag.Parse()
	if *pprofAddr != "" {
		go func() {
			if err := http.ListenAndServe(*pprofAddr, nil); err != nil {
				fmt.Fprintln(os.Stderr, "cwbroker: pprof:", err)
			}
		}()
	}
	if err := run(*port, *topics, *partitions, *segmentBytes); err != nil {
		fmt.Fprintln(os.Stderr, "cwbroker:", err)
		os.Exit(1)
	}
}

func run(port int, topicList string, partitions int, segmentBytes int64) error {
	if partitions <= 0 {
		return fmt.Errorf("-partitions must be positive, got %d", partitions)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(partitions),
		kfake.BrokerConfigs(map[string]string{"log.segment.bytes": strconv.FormatInt(segmentBytes, 10)}),
	}
	var topics []string
	for _, t := range strings.Split(topicList, ",") {
		if t = strings.TrimSpace(t); t != "" {
			topics = append(topics, t)
		}
	}
	if len(topics) > 0 {
		opts = append(opts, kfake.SeedTopics(int32(partitions), topics...))
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("start broker: %w", err)
	}
	defer cluster.Close()
	fmt.Println("listening", strings.Join(cluster.ListenAddrs(), ","))
	<-stop
	return nil
}
