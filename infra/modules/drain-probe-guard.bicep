// Issue 24: refuse a drain probe on a scale set whose automatic instance repairs watch it.
// Repairs replace, reimage or restart an instance whose health probe says unhealthy past the
// grace period (PT10M to PT90M), and rolling upgrades count unhealthy instances. The forwarder
// bounds its 503 below the shortest grace period until the event starts, but a started event
// (a long Freeze, a Redeploy) drains regardless. So the combination is refused before anything
// is written: the port of the probe repairs watch is read from the load balancer (reference()
// in the branch of ?: that is not taken is never evaluated). Repairs that watch the Application
// Health extension are refused the same way when the extension probes the drain probe's port
// (its settings.port, or 80 or 443 by its protocol when it names none); repairs that watch a
// probe or an extension on another port, or a TCP one (it sees the port open, not the 503),
// pass.
//
// No resource here, on purpose: checkov's Bicep parser (pycep-parser 0.5) predates fail(), so
// the infra tests let checkov skip this one file and evaluate its expressions themselves
// (tests/infra/test_infra_drain_probe_repairs.py). Parenthesized throughout for that parser.

@description('Name of the scale set (in the deployment\'s resource group).')
param vmssName string

@description('Port of the drain probe the installer configures (0: off).')
@minValue(0)
@maxValue(65535)
param drainProbePort int

@description('The scale set\'s automaticRepairsPolicy ({} when it has none).')
param repairsPolicy object

@description('Resource id of the scale set\'s health probe (networkProfile.healthProbe.id; empty when it has none).')
param healthProbeId string

@description('The scale set\'s VM extensions (virtualMachineProfile.extensionProfile.extensions; [] when it has none): repairs watch the Application Health extension when it is among them.')
param extensions array

var repairsOn = (drainProbePort != 0) && ((repairsPolicy.?enabled) ?? false)
var repairsProbe = ((!repairsOn) || empty(healthProbeId)) ? {} : reference(healthProbeId, '2023-09-01')
// A TCP probe sees only that the port accepts connections, which the drain probe does while it
// answers 503: only an HTTP(S) probe on the port sees the drain.
var repairsProbeSeesAnswers = toLower(string((repairsProbe.?protocol) ?? 'http')) != 'tcp'
var repairsWatchDrainProbe = repairsOn && repairsProbeSeesAnswers && (((repairsProbe.?port) ?? 0) == drainProbePort)
var healthExtensions = filter(extensions, e => ((((e.?properties.?publisher) ?? '') =~ 'Microsoft.ManagedServices') && startsWith(string((e.?properties.?type) ?? ''), 'ApplicationHealth')))
var healthExtensionsSeeingAnswers = filter(healthExtensions, e => (toLower(string((e.?properties.?settings.?protocol) ?? 'http')) != 'tcp'))
var healthExtensionPorts = map(healthExtensionsSeeingAnswers, e => string((e.?properties.?settings.?port) ?? ((toLower(string((e.?properties.?settings.?protocol) ?? 'http')) == 'https') ? 443 : 80)))
// Compared as text: a port written as a string ("8081") names the same port.
var extensionWatchesDrainProbe = repairsOn && contains(healthExtensionPorts, string(drainProbePort))
var refusal = 'Scale set ${vmssName}: its automatic instance repairs watch the load balancer probe ${healthProbeId} on port ${drainProbePort}, the drain probe\'s port. The drain probe answers 503 while the VM drains (bounded before the event starts, for as long as it lasts once it has), and repairs would replace, reimage or restart the instance. Fix one of: give repairs a probe of their own (a second load balancer probe on the application\'s health port, set as networkProfile.healthProbe), or watch the Application Health extension instead (on the application\'s own port), or disable automaticRepairsPolicy, or deploy with drainProbePort 0 (docs/vm-actions.md).'

var extensionRefusal = 'Scale set ${vmssName}: its automatic instance repairs watch the Application Health extension, which probes port ${drainProbePort}, the drain probe\'s port. The drain probe answers 503 while the VM drains (bounded before the event starts, for as long as it lasts once it has), and repairs would replace, reimage or restart the instance. Fix one of: point the extension\'s settings.port at the application\'s own health endpoint, or disable automaticRepairsPolicy, or deploy with drainProbePort 0 (docs/vm-actions.md).'

@description('The scale set\'s name, once the check passed (fail() stops the deployment otherwise).')
output vmssName string = repairsWatchDrainProbe ? fail(refusal) : (extensionWatchesDrainProbe ? fail(extensionRefusal) : vmssName)
