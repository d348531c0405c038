package fencing

// CheckLabelBinding decides the resource a write to an object guarded by
// label is checked against: the resource the stored object was guarded by
// (storedGuarded, storedResource), else the one the written object names.
// The resource cannot change while the object stays guarded
// (ReasonBindingMismatch), and it must be a valid resource ID by valid
// (ReasonNoResource). annotation is the annotation that names the resource,
// for the messages.
func CheckLabelBinding(storedGuarded, newGuarded bool, storedResource, newResource, annotation string, valid func(string) bool) (string, error) {
	resource := newResource
	if storedGuarded {
		resource = storedResource
		if newGuarded && newResource != resource {
			return "", &Error{Reason: ReasonBindingMismatch, Detail: "annotation " + annotation + " cannot change while the object is guarded"}
		}
	}
	if !valid(resource) {
		return "", refuse(ReasonNoResource, "guarded objects need annotation %s with a valid resource ID, got %q", annotation, resource)
	}
	return resource, nil
}
