// The Function App's roles on one resource group whose VMs it manages (lb-pools, and the
// approval gate's acknowledge fallback). Deployed once per group (main.bicep loops with
// scope: resourceGroup(name)), so these grants reach that group and nothing else.
//
// The ARM calls the app makes (functions/adapters/arm.py) and which role covers each:
//   GET  Microsoft.Compute/virtualMachines/{vm}                       Scheduled Events Contributor
//   GET  Microsoft.Network/networkInterfaces/{nic}                    Network Contributor
//   PUT  Microsoft.Network/networkInterfaces/{nic}                    Network Contributor
//   GET  Microsoft.Network/loadBalancers/{lb}                         Network Contributor
//   POST Microsoft.Network/loadBalancers/{lb}/loadBalancingRules/{rule}/health
//                                                                     Network Contributor
//   POST {vm}/providers/Microsoft.Maintenance/scheduledevents/{id}/acknowledge
//                                                                     Scheduled Events Contributor
//   GET  Microsoft.Compute/virtualMachineScaleSets/{ss}/virtualMachines/{id} (and its NICs)
//                                                                     none: not granted
// The last is a Uniform scale-set instance. Its pool membership belongs to the scale-set model,
// so the app leaves such instances in their pools in any case; without the read it gets 403,
// logs the missing permission and leaves them there just the same (README, Deploy).

@description('Principal id of the Function App identity.')
param functionAppPrincipalId string

// Network Contributor
var networkContributor = '4d97b98b-1d4f-4787-a291-c67834d212e7'
// Scheduled Events Contributor
var scheduledEventsContributor = 'b67fe603-310e-4889-b9ee-8257d09d353d'

// Network Contributor: lb-pools and the approval gate GET NICs (networkInterfaces/read); lb-pools
// PUTs them (networkInterfaces/write) to take ip configurations out of backend pools and put them
// back, with the record in the NIC's tags. ARM checks the PUT against what the NIC links to:
// restoring needs loadBalancers/backendAddressPools/join/action on the pool, and the subnet's
// virtualNetworks/subnets/join/action may be checked too. This role grants both for load
// balancers and virtual networks in this group only (README, Deploy). No Microsoft.Compute
// action.
resource appManagesPools 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionAppPrincipalId, networkContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', networkContributor)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Scheduled Events Contributor: its actions are Microsoft.Compute/virtualMachines/read,
// virtualMachineScaleSets/read, availabilitySets/read and
// Microsoft.Maintenance/scheduledevents/acknowledge/action. The app uses virtualMachines/read
// (lb-pools and the gate GET a VM to find its NICs) and, only with acknowledgeFallbackEnabled,
// the acknowledge action; it never reads scale sets or availability sets. Granted whether or not
// the fallback is on, because the VM reads need it and we know of no narrower built-in role
// with virtualMachines/read (Reader reads everything in the group; Virtual Machine User Login
// adds signing in to the VMs). It does not include virtualMachineScaleSets/virtualMachines/read
// (Uniform instances).
resource appReadsVmsAndAcknowledges 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionAppPrincipalId, scheduledEventsContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', scheduledEventsContributor)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}
