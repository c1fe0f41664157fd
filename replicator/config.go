package replicator

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Config configures a Stream. The zero value of every optional field is documented with it.
type Config struct {
	// DSN is the source database's connection string, as a URL or key=value pairs. Required. The
	// replication connection adds replication=database; the password never appears in errors.
	DSN string
	// Slot is the logical replication slot, using the pgoutput plugin. Required; 1 to 63 of
	// [a-z0-9_], as PostgreSQL requires.
	Slot string
	// Publication is the publication to stream. Required.
	Publication string
	// CreateSlot creates Slot when it does not exist. Zero: a missing slot is ErrSlotMissing.
	CreateSlot bool
	// ReplaceLostSlot drops Slot when it is invalidated (wal_status lost: it lost WAL it needed
	// and streams nothing any more) and creates it again (with CreateSlot), instead of
	// ErrSlotLost: an operator's choice (sync --on-slot-loss rebackfill); the position it held
	// is then not in the new slot, which the engine answers with a full backfill.
	ReplaceLostSlot bool
	// CreatePublication creates Publication, FOR TABLE PublicationTables, when it does not exist.
	// Zero: a missing publication is ErrPublicationMissing.
	CreatePublication bool
	// PublicationTables are the tables of a publication created by CreatePublication, each as
	// {schema, table}.
	PublicationTables []pgx.Identifier
	// StatusInterval is the time between standby status updates. Zero means 10s. Keep it well
	// below the server's wal_sender_timeout (60s by default).
	StatusInterval time.Duration
	// ReceiveTimeout is the longest silence from the server before Run gives up with ErrTimeout;
	// every status update asks the server for a reply, so a live server is never silent for
	// long. Zero means 60s.
	ReceiveTimeout time.Duration
	// InUseWait is how long Open waits for a slot that another process is streaming from to be
	// released before it fails with ErrSlotInUse: a consumer killed a moment ago leaves its
	// server process behind until the server notices the closed connection, and a restart
	// right after must not fail on it. Zero means DefaultInUseWait; negative, no wait.
	InUseWait time.Duration
	// ApplicationName names the connections in pg_stat_activity unless the DSN names them. Zero
	// means "tidemark".
	ApplicationName string
	// Configure, when set, adjusts every connection to the source after its DSN is parsed: the
	// dialer of an SSH tunnel, for instance. It must be safe to call more than once.
	Configure func(*pgconn.Config)
	// Messages asks for the logical messages of this prefix (the watermarks written as
	// messages); "*" asks for every message (tidemark stream). Zero: no message is asked for.
	// Either way a message of another prefix, or larger than MaxMessage, reaches Run with its
	// content emptied and never held (messages.go). Stream.KeepMessages sets it after Open.
	Messages string
}

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// CheckSlotName refuses a name PostgreSQL would refuse for a replication slot (1 to 63
// lower-case letters, digits and underscores): checked before anything uses the name, in a
// query or in SQL printed for a DBA.
func CheckSlotName(name string) error {
	if !slotName.MatchString(name) {
		return fmt.Errorf("replication slot name %q is invalid: use 1 to 63 lower-case letters, digits and underscores", name)
	}
	return nil
}

// Validate reports every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	if c.DSN == "" {
		errs = append(errs, errors.New("source connection string is empty"))
	}
	if err := CheckSlotName(c.Slot); err != nil {
		errs = append(errs, err)
	}
	if c.Publication == "" {
		errs = append(errs, errors.New("publication name is empty"))
	}
	if c.StatusInterval < 0 || c.ReceiveTimeout < 0 {
		errs = append(errs, errors.New("status interval and receive timeout must not be negative"))
	}
	for _, t := range c.PublicationTables {
		if len(t) != 2 || t[0] == "" || t[1] == "" {
			errs = append(errs, fmt.Errorf("publication table %q must be {schema, table}", []string(t)))
		}
	}
	return errors.Join(errs...)
}

func (c *Config) ensureDefaults() {
	if c.StatusInterval == 0 {
		c.StatusInterval = 10 * time.Second
	}
	if c.ReceiveTimeout == 0 {
		c.ReceiveTimeout = 60 * time.Second
	}
	if c.ApplicationName == "" {
		c.ApplicationName = "tidemark"
	}
	if c.InUseWait == 0 {
		c.InUseWait = DefaultInUseWait
	}
}

// DefaultInUseWait is Config.InUseWait's default: well above the moment a server needs to end
// the process of a client that died, well below anything a second consumer would notice.
const DefaultInUseWait = 5 * time.Second
