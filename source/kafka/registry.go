package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/cachewarden/cachewarden/decode"
)

// SchemaRegistry reads the schemas of Avro messages from a schema
// registry that speaks Confluent's REST API (Confluent Schema Registry,
// Apicurio's compatible API, Redpanda, Karapace) into the cache the
// decoders read. Each schema id is asked for once: after that, decoding
// its messages needs no registry. It is safe for concurrent use.
type SchemaRegistry struct {
	cl    *sr.Client
	cache *decode.AvroSchemaCache
	log   *slog.Logger
	m     *Metrics
	// user is the basic-auth user ("" none), for logs and /readyz.
	user string
	// mu lets one Fetch ask the registry at a time: partitions that wait
	// for the same new schema ask once. It guards the fields below.
	mu sync.Mutex
	// auth is why the registry last refused the credentials, until it
	// answers again.
	auth authState
	// unknown holds the ids the registry said it does not know, with the
	// time until which that answer is used (negativeSchemaTTL); at most
	// maxUnknownSchemaIDs of them.
	unknown map[uint32]time.Time
	// lastWarn is when the last unknown-id warning was logged; notLogged
	// counts the ids found unknown since then without a line.
	lastWarn  time.Time
	notLogged int
	// now is the clock (time.Now; tests replace it).
	now func() time.Time
}

// negativeSchemaTTL is how long the registry's answer that it does not
// know a schema id is used: meanwhile the id's messages are poison without
// asking again. A schema registered after that answer is used at most this
// long later.
const negativeSchemaTTL = time.Minute

// maxUnknownSchemaIDs bounds the ids remembered as unknown (a few dozen
// bytes each). When it is reached, expired ids are forgotten, and if none
// has expired an arbitrary one: it is asked again at its next message.
const maxUnknownSchemaIDs = 10_000

// unknownSchemaLogInterval is the shortest time between two warnings of
// schema ids unknown to the registry; a warning counts the ids found
// unknown since the previous one without being logged.
const unknownSchemaLogInterval = 10 * time.Second

// RegistryConfig is how to reach a schema registry.
type RegistryConfig struct {
	// URLs are the registry's base URLs, tried in order; required.
	URLs []string
	// Username and Password authenticate with HTTP basic auth when
	// Username is set.
	Username, Password string
	// TLS, when not nil, configures https:// URLs.
	TLS *tls.Config
	// Timeout bounds one request; default DefaultSchemaRegistryTimeout.
	Timeout time.Duration
}

// NewSchemaRegistry returns a client of the registry c describes (its URLs
// must not be empty). m may be nil; log nil discards.
func NewSchemaRegistry(c RegistryConfig, m *Metrics, log *slog.Logger) (*SchemaRegistry, error) {
	if len(c.URLs) == 0 {
		return nil, errors.New("kafka: schema registry: no URLs")
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultSchemaRegistryTimeout
	}
	opts := []sr.ClientOpt{
		sr.URLs(c.URLs...),
		sr.HTTPClient(&http.Client{Timeout: timeout}),
		sr.UserAgent("cachewarden"),
	}
	if c.TLS != nil {
		opts = append(opts, sr.DialTLSConfig(c.TLS))
	}
	if c.Username != "" {
		opts = append(opts, sr.BasicAuth(c.Username, c.Password))
	}
	cl, err := sr.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: schema registry: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	return &SchemaRegistry{cl: cl, cache: &decode.AvroSchemaCache{}, log: log, m: m, user: c.Username, unknown: map[uint32]time.Time{}, now: time.Now}, nil
}

// AuthFailure returns why the registry last refused the credentials
// (HTTP 401 or 403); "" when it has answered a request since, or never
// refused. Safe for concurrent use.
func (r *SchemaRegistry) AuthFailure() string {
	return r.auth.Failure()
}

// noteAuth records the outcome of a request: a refusal of the
// credentials is logged once until the registry answers again.
func (r *SchemaRegistry) noteAuth(err error) {
	var re *sr.ResponseError
	refused := errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden)
	if err != nil && !refused && !schemaNotFound(err) {
		return // no answer: says nothing of the credentials
	}
	if !refused {
		if r.auth.succeed() {
			r.log.Info("schema registry: credentials accepted again", "user", r.user)
		}
		return
	}
	auth := "no credentials"
	if r.user != "" {
		auth = fmt.Sprintf("basic auth as user %q", r.user)
	}
	if r.auth.fail(fmt.Sprintf("authentication failed (%s): HTTP %d", auth, re.StatusCode)) {
		r.log.Error("schema registry: the registry refused the credentials; check kafka.schema_registry.username and password (retrying, logged again only after a success)",
			"mechanism", "basic", "user", r.user, "status", re.StatusCode, "error", err.Error())
	}
}

// Cache returns the cache of compiled schemas that the decoders read
// (decode.Decoder.Schemas).
func (r *SchemaRegistry) Cache() *decode.AvroSchemaCache { return r.cache }

// maxSchemaReferenceDepth bounds the chain of schema references followed
// (a cycle would otherwise never end).
const maxSchemaReferenceDepth = 16

// Fetch reads the schemas of the ids the cache lacks and adds them. An id
// the registry answers it does not know stays out of the cache (its
// messages are poison: "unknown to the schema registry") and is not asked
// again for negativeSchemaTTL; its warning is logged at most once per
// unknownSchemaLogInterval for all such ids together. One registered
// as something else than Avro, or whose text is not a valid Avro schema,
// is cached as unusable (its messages are poison with that reason). Any
// other failure to get an answer (the registry unreachable, a timeout, an
// error status) is returned after the other ids were tried: the caller
// retries, and the partition waits.
func (r *SchemaRegistry) Fetch(ctx context.Context, ids []uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	now := r.now()
	for _, id := range ids {
		if r.cache.Lookup(id) != nil {
			continue // fetched meanwhile by another partition
		}
		if until, ok := r.unknown[id]; ok {
			if now.Before(until) {
				continue // the registry said lately it does not know it
			}
			delete(r.unknown, id)
		}
		s, err := r.fetch(ctx, id)
		r.noteAuth(err)
		switch {
		case err == nil:
			r.cache.Add(s)
			r.m.schemaFetches.WithLabelValues("found").Inc()
			r.log.Info("schema registry: schema cached", "schema_id", id, "schema", s.String())
		case schemaNotFound(err):
			r.m.schemaFetches.WithLabelValues("not_found").Inc()
			r.rememberUnknown(id, now)
			if now.Sub(r.lastWarn) < unknownSchemaLogInterval {
				r.notLogged++
				break
			}
			r.log.Warn("schema registry: schema id unknown to the registry; values framed with it are poison (keys framed with it name no columns) and it is not asked again for a while",
				"schema_id", id, "error", err.Error(), "not_asked_again_for", negativeSchemaTTL, "other_unknown_ids_not_logged", r.notLogged)
			r.lastWarn, r.notLogged = now, 0
		default:
			r.m.schemaFetches.WithLabelValues("error").Inc()
			errs = append(errs, fmt.Errorf("schema id %d: %w", id, err))
			if ctx.Err() != nil {
				return errors.Join(errs...)
			}
		}
	}
	return errors.Join(errs...)
}

// rememberUnknown remembers id as unknown to the registry until
// negativeSchemaTTL after now, within maxUnknownSchemaIDs.
func (r *SchemaRegistry) rememberUnknown(id uint32, now time.Time) {
	if len(r.unknown) >= maxUnknownSchemaIDs {
		for k, until := range r.unknown {
			if !now.Before(until) {
				delete(r.unknown, k)
			}
		}
		for k := range r.unknown {
			if len(r.unknown) < maxUnknownSchemaIDs {
				break
			}
			delete(r.unknown, k)
		}
	}
	r.unknown[id] = now.Add(negativeSchemaTTL)
}

// fetch reads and compiles one schema.
func (r *SchemaRegistry) fetch(ctx context.Context, id uint32) (*decode.AvroSchema, error) {
	s, err := r.cl.SchemaByID(ctx, int(id))
	if err != nil {
		return nil, err
	}
	if s.Type != sr.TypeAvro {
		return decode.UnusableAvroSchema(id, "registered as a "+s.Type.String()+" schema; cachewarden decodes Avro (and JSON without a registry)"), nil
	}
	var refs []string
	if err := r.references(ctx, s.References, &refs, 0); err != nil {
		return nil, err
	}
	compiled, err := decode.CompileAvroSchema(id, s.Schema, refs...)
	if err != nil {
		r.log.Error("schema registry: schema is not valid Avro; its messages are poison", "schema_id", id, "error", err.Error())
		return decode.UnusableAvroSchema(id, err.Error()), nil
	}
	return compiled, nil
}

// references appends to texts the schemas refs name, each after those it
// references itself.
func (r *SchemaRegistry) references(ctx context.Context, refs []sr.SchemaReference, texts *[]string, depth int) error {
	if len(refs) > 0 && depth >= maxSchemaReferenceDepth {
		return fmt.Errorf("schema references nest deeper than %d", maxSchemaReferenceDepth)
	}
	for _, ref := range refs {
		ss, err := r.cl.SchemaByVersion(ctx, ref.Subject, ref.Version)
		if err != nil {
			return fmt.Errorf("referenced schema %s (subject %s version %d): %w", ref.Name, ref.Subject, ref.Version, err)
		}
		if err := r.references(ctx, ss.References, texts, depth+1); err != nil {
			return err
		}
		if !slices.Contains(*texts, ss.Schema.Schema) {
			*texts = append(*texts, ss.Schema.Schema)
		}
	}
	return nil
}

// schemaNotFound reports whether err is the registry's answer that it does
// not know a schema. It is the one failure that makes messages poison;
// every other one holds the partition until the registry answers:
//   - 40403 (schema not found) and 40401/40402 (a referenced subject or
//     version not found): the registry was asked and answered; asking
//     again gives the same answer;
//   - a 404 without a registry error code: a wrong URL (a proxy's path, a
//     registry context), which the operator must fix, not a missing
//     schema: hold;
//   - 401 and 403: credentials the operator must fix: hold, since making
//     every message poison would lose every change meanwhile;
//   - 5xx, 429, timeouts, refused connections: transient: hold;
//   - the caller's context ending: not an answer: hold (the caller stops).
func schemaNotFound(err error) bool {
	var re *sr.ResponseError
	if !errors.As(err, &re) || re.StatusCode != http.StatusNotFound {
		return false
	}
	switch re.ErrorCode {
	case sr.ErrSchemaNotFound.Code, sr.ErrSubjectNotFound.Code, sr.ErrVersionNotFound.Code:
		return true
	}
	return false
}
