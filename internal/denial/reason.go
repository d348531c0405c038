package denial

import (
	"github.com/lockwarden/lockwarden/pkg/fencing"
	public "github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

// Reason returns the reason code of an API error returned for a request
// lockwarden's admission refused (403 Forbidden), or "" when there is none.
// It is the public decoder's (pkg/fencing/denial), which reads what Error and
// Response write.
func Reason(err error) fencing.Reason { return public.Reason(err) }
