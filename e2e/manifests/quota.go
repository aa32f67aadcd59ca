package manifests

// Redis are the values redis.yaml is rendered with: a Deployment and a Service, both named
// Name.
type Redis struct {
	Name, Namespace, Image string
}
