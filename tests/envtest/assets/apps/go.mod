// Wrapper module for the small programs the real node runs: `hello`, the application the
// tests and the demo deploy as AppServices, and `pause`, the Pod sandbox image's process.
// Each is a static binary put into an image with no base by the harness (crane append
// --oci-empty-base), since nothing can be pulled from the internet here.
module appservice-operator/envtest/apps

go 1.26.0

require github.com/jackc/pgx/v5 v5.13.0

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	golang.org/x/text v0.41.0 // indirect
)
