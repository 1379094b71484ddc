// Package tlsprofile turns OpenShift's cluster TLS security profile
// (`apiservers.config.openshift.io/cluster`, `.spec.tlsSecurityProfile`) into what das-webhook
// can serve: the chart's webhook.tls.minVersion and webhook.tls.cipherSuites.
//
// The profile tables (Old, Intermediate, Modern) are OpenShift's own, `TLSProfiles` of
// github.com/openshift/api/config/v1, so a new openshift/api brings the profiles OpenShift
// ships. What das-webhook can serve is its own: TLS 1.2 and 1.3, and the AEAD suites with forward
// secrecy of its TLS library (webhook/src/tls/policy.rs; webhookSuites below, kept in step by
// tlsprofile_test.go, which reads that file).
package tlsprofile

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	configv1 "github.com/openshift/api/config/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// APIServerName is the one APIServer object of an OpenShift cluster.
const APIServerName = "cluster"

// The versions das-webhook accepts (chart webhook.tls.minVersion).
const (
	VersionTLS12 = string(configv1.VersionTLS12)
	VersionTLS13 = string(configv1.VersionTLS13)
)

// Profile is a cluster's TLS security profile resolved to its parameters, before das-webhook's
// limits are applied.
type Profile struct {
	// Name says where the parameters come from, for messages: "Intermediate",
	// "Intermediate (unset: OpenShift's default)", "Custom".
	Name string
	// MinTLSVersion as OpenShift writes it (VersionTLS10 ... VersionTLS13); empty: no opinion.
	MinTLSVersion string
	// Ciphers, OpenSSL or IANA names, in order of preference; empty: no opinion.
	Ciphers []string
}

// FromAPIServer resolves `.spec.tlsSecurityProfile` of the APIServer: Old, Intermediate and
// Modern from openshift/api's TLSProfiles, Custom from its own fields; unset (nil, or no type)
// is Intermediate, OpenShift's default. A type this table does not know (a newer OpenShift), or
// Custom without its parameters, is Intermediate too, and the name says so.
func FromAPIServer(p *configv1.TLSSecurityProfile) Profile {
	if p == nil || p.Type == "" {
		return fromTable(configv1.TLSProfileIntermediateType, "Intermediate (unset: OpenShift's default)")
	}
	if p.Type == configv1.TLSProfileCustomType {
		if p.Custom == nil {
			return fromTable(configv1.TLSProfileIntermediateType, "Intermediate (Custom without parameters)")
		}
		return Profile{
			Name:          "Custom",
			MinTLSVersion: string(p.Custom.MinTLSVersion),
			Ciphers:       append([]string(nil), p.Custom.Ciphers...),
		}
	}
	if _, ok := configv1.TLSProfiles[p.Type]; !ok {
		return fromTable(configv1.TLSProfileIntermediateType, fmt.Sprintf("Intermediate (unknown type %q)", p.Type))
	}
	return fromTable(p.Type, string(p.Type))
}

func fromTable(t configv1.TLSProfileType, name string) Profile {
	spec := configv1.TLSProfiles[t]
	return Profile{Name: name, MinTLSVersion: string(spec.MinTLSVersion), Ciphers: append([]string(nil), spec.Ciphers...)}
}

// webhookSuite is a cipher suite das-webhook's TLS library implements, by its IANA and OpenSSL
// names (one name for TLS 1.3 suites).
type webhookSuite struct {
	iana, openssl string
	tls13         bool
}

// webhookSuites: the NAMES table of webhook/src/tls/policy.rs (rustls' ring provider).
var webhookSuites = []webhookSuite{
	{"TLS_AES_256_GCM_SHA384", "TLS_AES_256_GCM_SHA384", true},
	{"TLS_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256", true},
	{"TLS_CHACHA20_POLY1305_SHA256", "TLS_CHACHA20_POLY1305_SHA256", true},
	{"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "ECDHE-ECDSA-AES256-GCM-SHA384", false},
	{"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "ECDHE-ECDSA-AES128-GCM-SHA256", false},
	{"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305", false},
	{"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "ECDHE-RSA-AES256-GCM-SHA384", false},
	{"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "ECDHE-RSA-AES128-GCM-SHA256", false},
	{"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", "ECDHE-RSA-CHACHA20-POLY1305", false},
}

func lookup(name string) (webhookSuite, bool) {
	name = strings.TrimSpace(name)
	for _, s := range webhookSuites {
		if s.iana == name || s.openssl == name {
			return s, true
		}
	}
	return webhookSuite{}, false
}

// Webhook is what das-webhook is given: the chart's webhook.tls.minVersion and cipherSuites.
type Webhook struct {
	// MinVersion: VersionTLS12 or VersionTLS13; empty: the chart's default (VersionTLS12).
	MinVersion string
	// CipherSuites, passed through in order (das-webhook skips and logs those it lacks);
	// empty: its defaults.
	CipherSuites []string
	// Source says where they come from, for the log and the event.
	Source string
	// Notes are what was changed on the way and why: the admin reads them in the operator's
	// log and an event on the DASOperator.
	Notes []string
}

// Summary is one line for the log and the event.
func (w Webhook) Summary() string {
	minVersion := w.MinVersion
	if minVersion == "" {
		minVersion = VersionTLS12 + " (default)"
	}
	suites := "its default cipher suites"
	if len(w.CipherSuites) > 0 {
		suites = fmt.Sprintf("%d cipher suites", len(w.CipherSuites))
	}
	s := fmt.Sprintf("das-webhook TLS from %s: minimum %s, %s", w.Source, minVersion, suites)
	if len(w.Notes) > 0 {
		s += "; " + strings.Join(w.Notes, "; ")
	}
	return s
}

// ForWebhook fits a minimum version and cipher list to das-webhook:
//   - VersionTLS10 and VersionTLS11 become VersionTLS12: das-webhook serves TLS 1.2 and 1.3
//     only (the Old profile, a Custom one), with a note;
//   - with VersionTLS13 a list that names no TLS 1.3 suite is dropped: OpenShift does not
//     configure TLS 1.3 suites (its Custom profiles list TLS 1.2 ones), and das-webhook would
//     refuse to start with no suite to offer, so it offers its TLS 1.3 defaults;
//   - otherwise the list is passed through, and the suites das-webhook lacks (CBC, DHE,
//     static RSA) are counted in a note (das-webhook skips and logs them);
//   - a list of which das-webhook implements none is an error: it would not start.
func ForWebhook(minVersion string, ciphers []string, source string) (Webhook, error) {
	w := Webhook{Source: source}
	switch minVersion {
	case "":
	case string(configv1.VersionTLS10), string(configv1.VersionTLS11):
		w.MinVersion = VersionTLS12
		w.Notes = append(w.Notes, fmt.Sprintf("%s asks for %s, das-webhook serves TLS 1.2 and 1.3 only: %s",
			source, minVersion, VersionTLS12))
	case VersionTLS12, VersionTLS13:
		w.MinVersion = minVersion
	default:
		return Webhook{}, fmt.Errorf("%s: TLS minimum version %q: want VersionTLS10, VersionTLS11, VersionTLS12 or VersionTLS13",
			source, minVersion)
	}
	if len(ciphers) == 0 {
		return w, nil
	}
	implemented, tls13 := 0, 0
	for _, c := range ciphers {
		if s, ok := lookup(c); ok {
			implemented++
			if s.tls13 {
				tls13++
			}
		}
	}
	switch {
	case w.MinVersion == VersionTLS13 && tls13 == 0:
		w.Notes = append(w.Notes, fmt.Sprintf("%s lists no TLS 1.3 cipher suite: das-webhook offers its TLS 1.3 defaults", source))
		return w, nil
	case implemented == 0:
		names := make([]string, len(webhookSuites))
		for i, s := range webhookSuites {
			names[i] = s.openssl
		}
		return Webhook{}, fmt.Errorf("%s lists no TLS cipher suite das-webhook implements (it would not start); it offers %s (or their IANA names)",
			source, strings.Join(names, ", "))
	}
	w.CipherSuites = append([]string(nil), ciphers...)
	if skipped := len(ciphers) - implemented; skipped > 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("%d of its %d cipher suites are not offered (das-webhook's TLS library implements only AEAD suites with forward secrecy)",
			skipped, len(ciphers)))
	}
	return w, nil
}

// Reader reads the cluster's profile: the APIServer named cluster, through the manager's cache.
type Reader struct {
	Client client.Reader
}

// Read returns the resolved profile; a missing APIServer counts as unset (Intermediate).
func (r Reader) Read(ctx context.Context) (Profile, error) {
	var apiserver configv1.APIServer
	err := r.Client.Get(ctx, types.NamespacedName{Name: APIServerName}, &apiserver)
	switch {
	case apierrors.IsNotFound(err):
		return FromAPIServer(nil), nil
	case err != nil:
		return Profile{}, fmt.Errorf("reading the cluster's TLS security profile (apiservers.config.openshift.io %s): %w", APIServerName, err)
	}
	return FromAPIServer(apiserver.Spec.TLSSecurityProfile), nil
}

// Announcer logs what das-webhook is given and posts it as an event on the DASOperator, each
// time it changes (the translator runs at every reconcile; the same summary is said once).
type Announcer struct {
	Log      logr.Logger
	Recorder record.EventRecorder

	mu   sync.Mutex
	last string
}

// Announce says w if it differs from the last one said: a Warning event when something was
// adjusted (Notes), Normal otherwise.
func (a *Announcer) Announce(obj runtime.Object, w Webhook) {
	summary := w.Summary()
	a.mu.Lock()
	same := summary == a.last
	a.last = summary
	a.mu.Unlock()
	if same {
		return
	}
	a.Log.Info(summary)
	kind, reason := corev1.EventTypeNormal, "WebhookTLSProfile"
	if len(w.Notes) > 0 {
		kind, reason = corev1.EventTypeWarning, "WebhookTLSProfileAdjusted"
	}
	if a.Recorder != nil {
		a.Recorder.Event(obj, kind, reason, summary)
	}
}
