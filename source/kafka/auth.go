package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// kafkaAuth watches the SASL authentications of one Kafka client
// (kgo.HookBrokerRead): the client retries a failed authentication on
// every request without saying why, so that a wrong password showed as
// nothing at all, or as an EOF. A failure is logged once, naming the
// mechanism and the user (never the password), and kept for /readyz
// until a request of the client succeeds again. Safe for concurrent use.
type kafkaAuth struct {
	mechanism, user string
	log             *slog.Logger
	state           authState
}

// authState remembers why an authentication last failed, until the next
// success, and says which calls change that, so that its owner logs a
// failure once and a recovery once however often it retries. The zero
// value has no failure. Safe for concurrent use.
type authState struct {
	mu      sync.Mutex
	failure string // "" when none since the last success
}

// fail records reason and reports whether no failure was recorded before
// (the failure is news: log it).
func (s *authState) fail(reason string) (first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first = s.failure == ""
	s.failure = reason
	return first
}

// succeed forgets the failure and reports whether there was one (the
// recovery is news: log it).
func (s *authState) succeed() (recovered bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	recovered = s.failure != ""
	s.failure = ""
	return recovered
}

// Failure returns the failure recorded, "" when none.
func (s *authState) Failure() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failure
}

// Request keys of the Kafka protocol: SASL's, and ApiVersions, which
// every connection sends before authenticating.
const (
	saslHandshakeKey    = 17
	apiVersionsKey      = 18
	saslAuthenticateKey = 36
)

// OnBrokerRead implements kgo.HookBrokerRead: a failed read of a SASL
// response is a failed authentication (a broker refusing the credentials
// may just close the connection); any other response read, but
// ApiVersions', means an authenticated connection works.
func (a *kafkaAuth) OnBrokerRead(meta kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	switch {
	case key == saslHandshakeKey || key == saslAuthenticateKey:
		if err != nil {
			a.failed(fmt.Sprintf("broker %s:%d", meta.Host, meta.Port), err)
		}
	case key == apiVersionsKey:
		// Read before authenticating: says nothing of it.
	case err == nil:
		a.succeeded()
	}
}

// failed records a failed authentication with a broker and logs the
// first one since the last success.
func (a *kafkaAuth) failed(broker string, err error) {
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("the broker closed the connection (%w): credentials refused?", err)
	}
	reason := fmt.Sprintf("SASL %s authentication as user %q failed at %s: %v", a.mechanism, a.user, broker, err)
	if a.state.fail(reason) {
		a.log.Error("kafka: authentication failed; check kafka.sasl (retrying, logged again only after a success)",
			"mechanism", a.mechanism, "user", a.user, "at", broker, "error", err.Error())
	}
}

func (a *kafkaAuth) succeeded() {
	if a.state.succeed() {
		a.log.Info("kafka: authenticated", "mechanism", a.mechanism, "user", a.user)
	}
}

// Failure returns why the client's last authentication failed; "" when
// none failed since a request last succeeded.
func (a *kafkaAuth) Failure() string {
	if a == nil {
		return ""
	}
	return a.state.Failure()
}

// isAuthError reports whether err is a broker's refusal of SASL
// authentication.
func isAuthError(err error) bool {
	return errors.Is(err, kerr.SaslAuthenticationFailed) || errors.Is(err, kerr.UnsupportedSaslMechanism) ||
		errors.Is(err, kerr.IllegalSaslState)
}

// authProbeTimeout bounds probeAuth's request.
const authProbeTimeout = 5 * time.Second

// probeAuth sends cl a metadata request and records a refused
// authentication in a: a broker that answers the SASL request with an
// error code (as Apache Kafka does) leaves nothing for the read hook to
// see, and a consumer group that cannot reach its coordinator says
// nothing either.
func (a *kafkaAuth) probeAuth(ctx context.Context, cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(ctx, authProbeTimeout)
	defer cancel()
	_, err := cl.Request(ctx, kmsg.NewPtrMetadataRequest())
	if err != nil && isAuthError(err) {
		a.failed("the brokers", err)
	}
}

// clientHook returns the hook of type T that cl was built with; the zero
// T when it has none.
func clientHook[T kgo.Hook](cl *kgo.Client) T {
	var zero T
	// The client's hooks come back as a slice of an unexported type.
	for _, v := range cl.OptValues(kgo.WithHooks) {
		rv := reflect.ValueOf(v)
		if rv.Kind() != reflect.Slice {
			continue
		}
		for i := range rv.Len() {
			if h, ok := rv.Index(i).Interface().(T); ok {
				return h
			}
		}
	}
	return zero
}

// authFailure returns why cl's last SASL authentication failed; "" when
// none did or cl does not authenticate.
func authFailure(cl *kgo.Client) string {
	return clientHook[*kafkaAuth](cl).Failure()
}
